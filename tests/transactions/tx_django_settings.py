"""A minimal Django settings module for the C42 tests: PostgreSQL and MariaDB as Django databases.

Django's MySQL backend needs ``MySQLdb``; PyMySQL stands in for it (``install_as_MySQLdb``),
so the tests need no compiled client library. ``elsewhere`` is PostgreSQL's ``postgres``
database: the same server as the store, another database.
"""

import pymysql

pymysql.install_as_MySQLdb()

SECRET_KEY = "flexiq-tests"
USE_TZ = True
INSTALLED_APPS: list[str] = []
_POSTGRES = {"ENGINE": "django.db.backends.postgresql", "USER": "postgres", "HOST": "127.0.0.1"}
DATABASES = {
    "default": {**_POSTGRES, "NAME": "test"},
    "maria": {"ENGINE": "django.db.backends.mysql", "NAME": "test", "USER": "root", "HOST": "127.0.0.1"},
    "elsewhere": {**_POSTGRES, "NAME": "postgres"},
}
