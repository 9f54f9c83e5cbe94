"""Suite-wide fixtures."""

from collections.abc import Iterator

import pytest
import structlog

from gateway.server.config import Settings


@pytest.fixture(autouse=True)
def _isolated_logging_config() -> Iterator[None]:
    # Some tests run `figtank` entry points in-process, and those configure structlog for
    # the process; restore the previous configuration so no test inherits another's.
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _kafka_listener_off_by_default() -> None:
    """``listen.kafka`` defaults to the fixed port 9092: every in-process server of the
    suite would take it, and collide with its neighbours (or a Kafka broker on the
    machine). The tests that serve Kafka turn it on with ``kafka_listen="127.0.0.1:0"``;
    for the rest of the suite its default is "" (off). The documented default, which
    :func:`gateway.server.config.reference_table` reads from the field, is unchanged."""
    init = Settings.__init__
    code = init.__code__
    names = code.co_varnames[1:code.co_argcount]
    defaults = list(init.__defaults__ or ())
    defaults[names.index("kafka_listen") - (len(names) - len(defaults))] = ""
    init.__defaults__ = tuple(defaults)


_kafka_listener_off_by_default()
