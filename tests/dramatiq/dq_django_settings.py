"""A minimal Django settings module: django_dramatiq on the stub broker, DurableSteps by dotted path."""

import json
import os

SECRET_KEY = "flexiq-tests"
USE_TZ = True
INSTALLED_APPS = ["django_dramatiq"]
DATABASES: dict[str, dict[str, str]] = {}

DRAMATIQ_BROKER = {
    "BROKER": "dramatiq.brokers.stub.StubBroker",
    "OPTIONS": {},
    "MIDDLEWARE": [
        "dramatiq.middleware.Retries",
        "dramatiq_ext.DurableSteps",
    ],
}

FLEXIQ = {
    "STORE_URL": os.environ["FLEXIQ_TEST_STORE"],
    "MAX_HOP_SECONDS": "200ms",
    **json.loads(os.environ.get("FLEXIQ_TEST_OPTIONS", "{}")),
}
