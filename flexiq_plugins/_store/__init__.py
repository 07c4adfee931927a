"""Step stores: the interface, the in-memory store and the SQL store."""
