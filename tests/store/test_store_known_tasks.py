"""C43: the store's table of tasks known to take steps, on every store (memory, SQLite, PostgreSQL, MariaDB).

The first attempt of a task that takes a step notes it (insert-if-absent);
producers and workers read the set back to decide which jobs are recorded at
publish and, on Celery, acknowledged late.
"""

from __future__ import annotations

from flexiq_plugins import KnownTask, StepStore


def test_c43_a_new_store_knows_no_task(store: StepStore) -> None:
    """C43: nothing is known before any task took a step."""
    assert store.durable_tasks() == []


def test_c43_a_noted_task_is_listed_with_its_framework_and_first_seen_time(store: StepStore) -> None:
    """C43: a noted task is read back with its framework and a first-seen time on the store's clock."""
    before = store.now()
    store.note_durable_task("shop.charge", "celery")
    after = store.now()
    [task] = store.durable_tasks()
    assert (task.name, task.framework) == ("shop.charge", "celery")
    assert before - 1 <= task.first_seen <= after + 1


def test_c43_noting_a_task_again_keeps_its_first_seen_time(store: StepStore) -> None:
    """C43: insert-if-absent: a second note (another process, a later attempt) changes nothing."""
    store.note_durable_task("shop.charge", "celery")
    [first] = store.durable_tasks()
    store.note_durable_task("shop.charge", "celery")
    assert store.durable_tasks() == [first]


def test_c43_tasks_are_told_apart_by_framework_and_listed_in_order(store: StepStore) -> None:
    """C43: a Celery task and a Dramatiq actor of one name are two known tasks; the list is ordered."""
    store.note_durable_task("zeta", "dramatiq")
    store.note_durable_task("alpha", "dramatiq")
    store.note_durable_task("zeta", "celery")
    listed = [(t.framework, t.name) for t in store.durable_tasks()]
    assert listed == [("celery", "zeta"), ("dramatiq", "alpha"), ("dramatiq", "zeta")]
    assert all(isinstance(t, KnownTask) for t in store.durable_tasks())


def test_c43_a_long_task_name_round_trips(store: StepStore) -> None:
    """C43: a name of 255 characters (the column's width), non-ASCII included, comes back unchanged."""
    name = "tâche." + "x" * 249
    store.note_durable_task(name, "celery")
    assert [t.name for t in store.durable_tasks()] == [name]
