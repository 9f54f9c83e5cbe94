"""One frozen settings object, from a TOML file and command-line flags.

Every option is declared once, as a field of :class:`Settings`: its key in the TOML
file, its flag, its type, default and help. :data:`OPTIONS` (one row a setting), the
CLI flags, the config-file parser and the configuration reference (docs/configuration.md) all derive
from those fields. The parsers of the values, and the listener tables, are
:mod:`gateway.core.config_values`'s (imported from here as before). The listeners and
backends do not receive :class:`Settings` whole: each gets its section of it
(:mod:`gateway.core.sections`).
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final, TypeVar, cast

from gateway.core.config_values import (
    KAFKA_COMPRESSIONS,
    MIB,
    PROTOCOLS,
    SASL_MECHANISMS,
    UPSTREAM_COMPRESSIONS,
    ConfigError,
    ListenerSpec,
    ListenerTable,
    TLSFiles,
    _addresses,
    _boolean,
    _choice,
    _host_names,
    _listener_tables,
    _non_negative_float,
    _non_negative_int,
    _optional_address,
    _optional_choice,
    _optional_file,
    _optional_path,
    _origins,
    _path,
    _percent,
    _positive_float,
    _positive_int,
    _text,
    _topic_codecs,
    _topic_config,
    _workers,
    parse_address,
)

__all__ = ["KAFKA_COMPRESSIONS", "LISTEN", "MIB", "OPTIONS", "PROTOCOLS", "SASL_MECHANISMS",
           "UPSTREAM_COMPRESSIONS", "ConfigError", "ListenerSpec", "ListenerTable", "Option",
           "Settings", "TLSFiles", "add_setting_flags", "flag_overrides", "load_settings",
           "parse_address", "reference_table", "settings_from_mapping"]


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: TOML ``key`` (``section.name``), attribute, parser and help."""

    key: str
    attr: str
    parse: Callable[[object], Any]
    default: Any
    help: str
    flag: str | None = None


def _setting(key: str, default: T, parse: Callable[[object], T], help: str,
             flag: str | None = None) -> T:
    """A field of :class:`Settings` with everything else said of it: its TOML ``key``, the
    parser of its values, its help and its command-line ``flag`` (None: file only)."""
    return declared_field(default, {"key": key, "parse": parse, "help": help, "flag": flag})


def declared_field(default: T, metadata: dict[str, Any]) -> T:
    """A dataclass field with ``default`` and ``metadata`` (a dict default is copied for
    each instance): how :class:`Settings` and the sections declare theirs."""
    if isinstance(default, dict):
        return cast(T, field(default_factory=lambda: dict(default), metadata=metadata))
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway is configured with. Build it with :func:`load_settings`.

    Each field is the one declaration of a setting: :data:`OPTIONS`, the config-file
    parser, the command-line flags and the docs' reference are made from them."""

    data_dir: Path = _setting(  # noqa: RUF009 (a field, made by _setting)
        "store.data_dir", Path("data"), _path,
        "Directory of the embedded log (Tank's on-disk layout).", "--data-dir")
    durability: str = _setting(
        "store.durability", "fsync", _choice("fsync", "os"),
        "fsync: acknowledge after the bundle is fsynced (group commit); "
        "os: after write(), like the Tank broker.", "--durability")
    max_bundle_bytes: int = _setting(
        "store.max_bundle_bytes", 64 * MIB, _positive_int,
        "Largest bundle accepted for one partition.", "--max-bundle-bytes")
    retention_check_secs: float = _setting(
        "store.retention_check_secs", 30.0, _non_negative_float,
        "How often retention and age-based rolling run.")
    check_rolled_segments: str = _setting(
        "store.check_rolled_segments", "lazy", _choice("lazy", "startup"),
        "When rolled segments are checked for damage: the first time each is read "
        "(lazy), or all at start-up.")
    tail_cache_bytes: int = _setting(
        "store.tail_cache_bytes", 16 * MIB, _non_negative_int,
        "Memory for the newest bundles of all partitions, read by the readers at the "
        "tail instead of the files (0: off).")
    min_free_bytes: int = _setting(
        "store.min_free_bytes", 256 * MIB, _non_negative_int,
        "Free space kept on the data directory's filesystem: a write that would leave "
        "less free is refused as disk full before the filesystem refuses it, and /health "
        "says not ready (0: no floor). Capped at store.min_free_percent of the "
        "filesystem's size, for small disks.", "--min-free-bytes")
    min_free_percent: float = _setting(
        "store.min_free_percent", 5.0, _percent,
        "The floor of free space is at most this percentage of the data directory's "
        "filesystem (the smaller of the two applies).")
    max_prefill_bytes: int = _setting(
        "store.max_prefill_bytes", 128 * MIB, _non_negative_int,
        "fsync durability: zeros written ahead of all active segments together at most "
        "(each takes up to 4 MiB, only from space above the floor, and gives it back "
        "when a write needs it; 0: none).")
    tank_listen: str = _setting(
        "listen.tank", "127.0.0.1:11011", _optional_address,
        "Tank protocol listener (empty: off).", "--tank-listen")
    figg_listen: str = _setting(
        "listen.figg", "127.0.0.1:8119", _optional_address,
        "Figg protocol listener (empty: off).", "--figg-listen")
    kafka_listen: str = _setting(
        "listen.kafka", "127.0.0.1:9092", _optional_address,
        "Kafka protocol listener (empty: off).",
        "--kafka-listen")
    kafka_advertised: str = _setting(
        "listen.kafka_advertised", "", _optional_address,
        "HOST:PORT the Kafka listener tells clients to connect to in Metadata (empty: "
        "the address it is bound to).", "--kafka-advertised")
    kafka_fetch_compression: str = _setting(
        "kafka.fetch_compression", "none", _choice(*KAFKA_COMPRESSIONS),
        "Codec of the record batches a Kafka Fetch serves compressed data in (what was "
        "produced compressed, stored as Snappy bundles); data stored uncompressed is "
        "served uncompressed. Every Kafka client reads none and gzip (stock kafkajs no "
        "other); zstd goes to Fetch v10+ only (older requests get gzip). See the Kafka "
        "listener's *Compression*.", "--kafka-fetch-compression")
    kafka_fetch_compression_topics: dict[str, str] = _setting(  # noqa: RUF009 (a field)
        "kafka.fetch_compression_topics", {}, _topic_codecs,
        "kafka.fetch_compression of some topics, by name: {\"logs\" = \"zstd\"}.")
    offsets_file: Path | None = _setting(  # noqa: RUF009 (a field, made by _setting)
        "offsets.file", None, _optional_path,
        "File of the Kafka groups' committed offsets (empty: figtank-offsets.log in "
        "store.data_dir; in bridge mode empty keeps them in memory only).",
        "--offsets-file")
    offsets_max_entries: int = _setting(
        "offsets.max_entries", 100_000, _positive_int,
        "Committed offsets kept (groups x partitions); a commit of one more is refused.")
    offsets_max_bytes: int = _setting(
        "offsets.max_bytes", 64 * MIB, _positive_int,
        "Bytes of committed offsets kept (group, topic and metadata strings, 64 bytes "
        "more each): bounds their memory and file.")
    offsets_metadata_max_bytes: int = _setting(
        "offsets.metadata_max_bytes", 4096, _non_negative_int,
        "Longest metadata string of a committed offset (Kafka's "
        "offset.metadata.max.bytes); longer is OFFSET_METADATA_TOO_LARGE.")
    offsets_compact_bytes: int = _setting(
        "offsets.compact_bytes", 16 * MIB, _positive_int,
        "The offsets file is rewritten with only the live offsets once larger than this "
        "and twice what they take.")
    offsets_lag_series: int = _setting(
        "offsets.lag_series", 1000, _non_negative_int,
        "Series of figtank_committed_lag_messages{group,topic,partition} at most (the "
        "first in name order; 0: off).")
    metrics_listen: str = _setting(
        "listen.metrics", "127.0.0.1:9464", _optional_address,
        "Prometheus metrics and health endpoint (empty: off).", "--metrics-listen")
    http_listen: str = _setting(
        "listen.http", "127.0.0.1:8080", _optional_address,
        "HTTP listener: produce, fetch, Server-Sent Events, WebSocket and the web console "
        "(empty: off).", "--http-listen")
    listeners: dict[str, ListenerTable] = _setting(  # noqa: RUF009 (a field, made by _setting)
        "listeners", {}, _listener_tables,
        "Named listeners, [listeners.NAME]: settings of the listener listen.NAME opens "
        "(tank, figg, kafka, metrics, http), or one more listener (its protocol: tank, "
        "figg, kafka, metrics or http; address = \"HOST:PORT\"); each may set tls_cert, tls_key, "
        "tls_client_ca (over the tls.* settings) or tls = false; a Kafka listener may "
        "require SASL: sasl_mechanisms = [\"SCRAM-SHA-256\", \"SCRAM-SHA-512\", \"PLAIN\"] "
        "(PLAIN only with TLS, unless sasl_plain_without_tls = true). See *Securing "
        "figtank*.")
    tls_cert: str = _setting(
        "tls.cert", "", _optional_file,
        "Certificate chain (PEM) of every listener without a tls_cert of its own: with "
        "tls.key, TLS on every listener (empty: plain TCP).", "--tls-cert")
    tls_key: str = _setting(
        "tls.key", "", _optional_file,
        "Private key (PEM) of tls.cert.", "--tls-key")
    tls_client_ca: str = _setting(
        "tls.client_ca", "", _optional_file,
        "CA certificates (PEM) of the clients: mutual TLS on the TLS listeners; a client "
        "without a certificate signed by one is refused in the handshake.",
        "--tls-client-ca")
    upstream: tuple[str, ...] = _setting(
        "upstream.brokers", (), _addresses,
        "Bridge mode: upstream Tank brokers, tried in order (empty: embedded store).",
        "--upstream")
    upstream_wait_secs: float = _setting(
        "upstream.wait_secs", 5.0, _positive_float,
        "Bridge and upstream-Kafka modes: how long a request waits for an unreachable "
        "upstream (a produce, a look-up) before it fails with the protocol's unavailable "
        "answer (a Figg publisher's connection is closed).")
    upstream_kafka: tuple[str, ...] = _setting(
        "upstream_kafka.bootstrap_servers", (), _addresses,
        "Upstream-Kafka mode: bootstrap servers of a Kafka-protocol cluster the gateway "
        "fronts (empty: embedded store); not with upstream.brokers. See "
        "docs/upstream-kafka.md.", "--upstream-kafka")
    upstream_kafka_client_id: str = _setting(
        "upstream_kafka.client_id", "figtank", _text,
        "Client id the gateway gives the upstream cluster.", "--upstream-kafka-client-id")
    upstream_kafka_tls: bool = _setting(
        "upstream_kafka.tls", False, _boolean,
        "Connect to the upstream cluster with TLS (implied by tls_ca, tls_cert).")
    upstream_kafka_tls_ca: str = _setting(
        "upstream_kafka.tls_ca", "", _optional_file,
        "CA certificates (PEM) the upstream brokers' certificates are checked against "
        "(empty: the system's).")
    upstream_kafka_tls_cert: str = _setting(
        "upstream_kafka.tls_cert", "", _optional_file,
        "Client certificate (PEM) for mutual TLS with the upstream cluster.")
    upstream_kafka_tls_key: str = _setting(
        "upstream_kafka.tls_key", "", _optional_file,
        "Private key (PEM) of upstream_kafka.tls_cert.")
    upstream_kafka_sasl_mechanism: str = _setting(
        "upstream_kafka.sasl_mechanism", "", _optional_choice(*SASL_MECHANISMS),
        "SASL mechanism to authenticate to the upstream cluster with (PLAIN, "
        "SCRAM-SHA-256, SCRAM-SHA-512; empty: none).")
    upstream_kafka_sasl_username: str = _setting(
        "upstream_kafka.sasl_username", "", _text,
        "SASL user name at the upstream cluster.")
    upstream_kafka_sasl_password: str = _setting(
        "upstream_kafka.sasl_password", "", _text,
        "SASL password at the upstream cluster.")
    upstream_kafka_compression: str = _setting(
        "upstream_kafka.compression", "producer", _choice(*UPSTREAM_COMPRESSIONS),
        "Codec of the record batches the gateway produces to the upstream cluster: "
        "producer (Snappy where the client compressed its bundle, else none), none, gzip, "
        "snappy, lz4 or zstd.")
    upstream_kafka_max_batch_bytes: int = _setting(
        "upstream_kafka.max_batch_bytes", 512 * 1024, _positive_int,
        "Records (bytes once uncompressed) merged into one record batch per partition and "
        "Produce request; keep it under the upstream's max.message.bytes (a batch it "
        "refuses as too large is sent again one bundle per batch). Smaller batches let the "
        "upstream store one while the gateway builds the next.")
    upstream_kafka_read_ahead: int = _setting(
        "upstream_kafka.read_ahead", 16, _non_negative_int,
        "Reads behind the tail fetched ahead of the reader at once (each one Fetch of at "
        "most 2 MiB, all together at most 4 MiB each once converted; dropped when not "
        "taken within 5 s); 0: none.")
    upstream_kafka_delivery_timeout_secs: float = _setting(
        "upstream_kafka.delivery_timeout_secs", 10.0, _positive_float,
        "How long the gateway tries to have a publish acknowledged by the upstream before "
        "the front end gets its error.")
    auto_create_topics: bool = _setting(
        "topics.auto_create", True, _boolean,
        "Create a topic on first produce, publish or attach.", "--auto-create-topics")
    default_partitions: int = _setting(
        "topics.default_partitions", 1, _positive_int,
        "Partitions of an auto-created topic.", "--default-partitions")
    topic_config: dict[str, str] = _setting(  # noqa: RUF009 (a field, made by _setting)
        "topics.config", {}, _topic_config,
        "Tank config keys for new topics, e.g. {\"log.segment.bytes\" = \"1073741824\"}.")
    max_frame_bytes: int = _setting(
        "limits.max_frame_bytes", 64 * MIB, _positive_int,
        "Largest frame a client may send; larger closes the connection.",
        "--max-frame-bytes")
    max_connections: int = _setting(
        "limits.max_connections", 10_000, _positive_int,
        "Connections served at once per listener; more are closed on accept.",
        "--max-connections")
    idle_timeout_secs: float = _setting(
        "limits.idle_timeout_secs", 16.0, _non_negative_float,
        "A connection that sends nothing for this long while nothing is in flight (on "
        "Figg: and no subscription) is closed (0: never).")
    frame_timeout_secs: float = _setting(
        "limits.frame_timeout_secs", 30.0, _non_negative_float,
        "A connection that started a frame and has not sent the rest of it this long "
        "after its first byte is closed; time the server held it back does not count "
        "(0: never).")
    max_requests_in_flight: int = _setting(
        "limits.max_requests_in_flight", 1024, _positive_int,
        "Requests one connection may have being served at once before it stops being "
        "read; also the Figg subscriptions of one connection (one more ATTACH closes it).")
    unacked_bytes: int = _setting(
        "limits.unacked_bytes", 16 * MIB, _positive_int,
        "Produce and publish bytes one connection may have waiting for their "
        "acknowledgement before it stops being read.")
    response_buffer_bytes: int = _setting(
        "limits.response_buffer_bytes", 8 * MIB, _positive_int,
        "Response bytes (Consume chunks and Fetch batches included) queued for one Tank "
        "or Kafka connection before it stops being read.")
    max_topics: int = _setting(
        "limits.max_topics", 10_000, _positive_int,
        "Topics the server holds; creating more is refused (CreateTopic: error 2; "
        "auto-creation: as an unknown topic).")
    max_partitions: int = _setting(
        "limits.max_partitions", 20_000, _positive_int,
        "Partitions of all topics together; creating more is refused like a topic past "
        "limits.max_topics. Each partition holds two descriptors.")
    max_open_segments: int = _setting(
        "limits.max_open_segments", 1000, _positive_int,
        "Rolled segment files kept open at once for readers (least recently read are "
        "closed first; a read in flight keeps its file open).")
    open_files: int = _setting(
        "limits.open_files", 0, _non_negative_int,
        "Descriptor limit (soft RLIMIT_NOFILE) to run with; 0: what the store and the "
        "listeners want, at most the hard limit. Start-up fails, saying what is needed, "
        "if the data directory needs more (2 per partition + 64).")
    max_producer_states: int = _setting(
        "limits.max_producer_states", 20_000, _positive_int,
        "Idempotent Kafka producers' sequence states kept (one per producer id and "
        "partition written, with its last 5 batches: about 1.5 KB), in memory and, over "
        "the embedded store, on disk with each partition (all partitions together); past "
        "it the least recently used is forgotten, and that producer's next batch there is "
        "accepted at any sequence.")
    metric_topics: int = _setting(
        "limits.metric_topics", 1000, _positive_int,
        "Topics with their own series in per-topic metrics (the first seen); the others "
        "are summed under topic=\"_other\".")
    subscriber_buffer_bytes: int = _setting(
        "limits.subscriber_buffer_bytes", 4 * MIB, _positive_int,
        "Bytes queued for one Figg connection before its subscriptions stop reading "
        "the log and wait for the socket.")
    http_max_connections: int = _setting(
        "limits.http_max_connections", 32, _positive_int,
        "Connections the metrics and health endpoint serves at once; more are closed on "
        "accept.")
    http_timeout_secs: float = _setting(
        "limits.http_timeout_secs", 5.0, _positive_float,
        "The metrics and health endpoint closes a connection that takes longer than this "
        "to send a request and read the answer (an idle keep-alive connection too).")
    tls_handshake_timeout_secs: float = _setting(
        "limits.tls_handshake_timeout_secs", 10.0, _non_negative_float,
        "A TLS connection that has not finished its handshake this long after it was "
        "accepted is closed (0: never).")
    sasl_timeout_secs: float = _setting(
        "limits.sasl_timeout_secs", 10.0, _non_negative_float,
        "A connection to a SASL listener that has not authenticated this long after it "
        "was accepted (after its TLS handshake) is closed (0: never).")
    http_max_body_bytes: int = _setting(
        "http.max_body_bytes", 1 * MIB, _positive_int,
        "Largest request body (a produce, an NDJSON batch) and WebSocket message the HTTP "
        "listener takes; larger is 413 (WebSocket: close code 1009).")
    http_max_wait_ms: int = _setting(
        "http.max_wait_ms", 30_000, _non_negative_int,
        "Longest long-poll wait of an HTTP fetch (wait_ms above it is cut to it).")
    http_heartbeat_secs: float = _setting(
        "http.heartbeat_secs", 15.0, _positive_float,
        "A Server-Sent Events stream with nothing to send this long gets a comment line, "
        "so proxies keep it open.")
    http_subscriber_buffer_bytes: int = _setting(
        "http.subscriber_buffer_bytes", 1 * MIB, _positive_int,
        "Bytes a live SSE or WebSocket subscriber may fall behind the messages read for "
        "it; further behind, it is closed (its last event id or offset says where to "
        "resume).")
    http_tail_buffer_bytes: int = _setting(
        "http.tail_buffer_bytes", 4 * MIB, _positive_int,
        "Newest messages kept per partition for the HTTP listener's live subscribers, "
        "encoded once for all of them.")
    http_cors_origins: tuple[str, ...] = _setting(
        "http.cors_origins", (), _origins,
        "Origins (\"https://app.example\", or \"*\") whose pages may call the HTTP "
        "listener (CORS); empty: same origin only.")
    http_allowed_hosts: tuple[str, ...] = _setting(
        "http.allowed_hosts", (), _host_names,
        "Host names the HTTP listener answers to beyond those that can not be rebound "
        "(IP addresses, localhost, one-label names), against DNS rebinding: "
        "\"figtank.example.com\", \".example.com\" (and its subdomains) or \"*\" "
        "(any). Empty: a listener on a loopback address answers to no other name, one on "
        "another address to every name; other names get 421.")
    http_ws_publish_window: int = _setting(
        "http.ws_publish_window", 1000, _positive_int,
        "Publishes one WebSocket may have waiting for their acknowledgement; one more "
        "closes it (code 1008).")
    http_idempotency_max_keys: int = _setting(
        "http.idempotency_max_keys", 100_000, _positive_int,
        "Idempotency-Key values of HTTP produces remembered with their answers (in the "
        "data directory, across restarts); past it the oldest are forgotten.")
    http_idempotency_max_bytes: int = _setting(
        "http.idempotency_max_bytes", 64 * MIB, _positive_int,
        "Bytes of answers remembered for Idempotency-Key values (memory and file); past it "
        "the oldest keys are forgotten.")
    http_idempotency_ttl_secs: float = _setting(
        "http.idempotency_ttl_secs", 86_400.0, _positive_float,
        "How long an Idempotency-Key is remembered after its last answer; a retry later "
        "than that is a new request.")
    http_jwt_hs256_secret_file: str = _setting(
        "http.jwt_hs256_secret_file", "", _optional_file,
        "File holding the shared secret of HS256 JWT bearer tokens on the HTTP listener "
        "(their sub claim is the user a policy names user:SUB; empty: no HS256 tokens). "
        "Needs the jwt extra.")
    http_jwt_rs256_public_key_file: str = _setting(
        "http.jwt_rs256_public_key_file", "", _optional_file,
        "PEM public key of RS256 JWT bearer tokens on the HTTP listener (empty: none). "
        "Needs the jwt extra.")
    http_jwt_audience: str = _setting(
        "http.jwt_audience", "", str,
        "The aud claim JWT bearer tokens must carry (empty: not checked).")
    http_jwt_issuer: str = _setting(
        "http.jwt_issuer", "", str,
        "The iss claim JWT bearer tokens must carry (empty: not checked).")
    figg_data_cache_bytes: int = _setting(
        "figg.data_cache_bytes", 8 * MIB, _non_negative_int,
        "Memory for the DATA frames shared by Figg subscribers at the same position "
        "(0: off).")
    group_initial_rebalance_delay_ms: int = _setting(
        "groups.initial_rebalance_delay_ms", 300, _non_negative_int,
        "Kafka consumer groups: how long the first rebalance of an empty group waits for "
        "more members (Kafka's group.initial.rebalance.delay.ms), extended by this much "
        "for each member that joins meanwhile, up to the rebalance timeout.")
    group_min_session_timeout_ms: int = _setting(
        "groups.min_session_timeout_ms", 6000, _positive_int,
        "Shortest session timeout a group member may ask for (Kafka's "
        "group.min.session.timeout.ms); shorter is INVALID_SESSION_TIMEOUT (26).")
    group_max_session_timeout_ms: int = _setting(
        "groups.max_session_timeout_ms", 1_800_000, _positive_int,
        "Longest session timeout a group member may ask for (Kafka's "
        "group.max.session.timeout.ms).")
    max_groups: int = _setting(
        "groups.max_groups", 1000, _positive_int,
        "Consumer groups with members (or joining) at once; a join that would make one "
        "more is COORDINATOR_NOT_AVAILABLE (15), retried by clients.")
    max_group_members: int = _setting(
        "groups.max_members", 1000, _positive_int,
        "Members of one group, those given a member id and not yet joined included "
        "(Kafka's group.max.size); one more is GROUP_MAX_SIZE_REACHED (81).")
    max_group_member_bytes: int = _setting(
        "groups.max_member_bytes", 1 * MIB, _positive_int,
        "Protocol metadata (all its protocols) plus assignment of one member; more is "
        "GROUP_MAX_SIZE_REACHED (81) on JoinGroup or SyncGroup.")
    max_group_bytes: int = _setting(
        "groups.max_bytes", 64 * MIB, _positive_int,
        "Protocol metadata plus assignments of every member of every group together; "
        "a join or assignment past it is GROUP_MAX_SIZE_REACHED (81).")
    policy_file: Path | None = _setting(  # noqa: RUF009 (a field, made by _setting)
        "auth.policy_file", None, _optional_path,
        "Access policy file (TOML: who may publish, subscribe, create, configure; see "
        "Access policy); reloaded on SIGHUP. Empty: everything is allowed.",
        "--policy-file")
    workers: int = _setting(
        "server.workers", 1, _workers,
        "Processes serving the listeners together (auto: one per core); more than 1 "
        "only in bridge or upstream-Kafka mode (the embedded store is one process's). "
        "See docs/workers.md.", "--workers")
    allocator_keep_bytes: int = _setting(
        "server.allocator_keep_bytes", 32 * MIB, _non_negative_int,
        "Free memory the C allocator keeps for the next large buffers (glibc's trim "
        "threshold; allocations up to 4 MiB then come from the heap, not fresh pages: "
        "converting a produce of thousands of messages costs half the CPU). 0: the C "
        "library's defaults.")
    log_level: str = _setting(
        "log.level", "info", _choice("debug", "info", "warning", "error"),
        "Lowest level logged.", "--log-level")
    log_format: str = _setting(
        "log.format", "auto", _choice("auto", "json", "console"),
        "json: one JSON object a line; console: for people; auto: console on a terminal.",
        "--log-format")

    def __post_init__(self) -> None:
        self.listener_specs()  # a TLS setting missing its pair is an error now
        if self.upstream and self.upstream_kafka:
            raise ConfigError("upstream_kafka.bootstrap_servers: figtank fronts one log: "
                              "give either upstream.brokers (--upstream, a Tank broker) or "
                              "upstream_kafka.bootstrap_servers (--upstream-kafka), not both")
        if bool(self.upstream_kafka_tls_cert) != bool(self.upstream_kafka_tls_key):
            raise ConfigError("upstream_kafka.tls_cert: a client certificate and its key "
                              "go together: set upstream_kafka.tls_cert and tls_key")
        if self.workers > 1 and not self.upstream_mode:
            raise ConfigError(f"server.workers: {self.workers} workers need an upstream "
                              "(--upstream or --upstream-kafka): the embedded store is one "
                              "process's and can not be shared; run one worker")
        if self.workers > 1 and self.offsets_file is not None:
            raise ConfigError("offsets.file: a gateway of several workers keeps no "
                              "committed offsets (every worker would write the file, and "
                              "groups are refused); remove offsets.file or run one worker")
        if self.upstream_kafka_sasl_mechanism and not self.upstream_kafka_sasl_username:
            raise ConfigError("upstream_kafka.sasl_username: SASL to the upstream needs a "
                              "user name (and upstream_kafka.sasl_password)")

    @property
    def bridge_mode(self) -> bool:
        """In front of an upstream Tank broker."""
        return bool(self.upstream)

    @property
    def upstream_kafka_mode(self) -> bool:
        """In front of an upstream Kafka-protocol cluster."""
        return bool(self.upstream_kafka)

    @property
    def upstream_mode(self) -> bool:
        """Fronting an upstream log of either kind: no log of the gateway's own."""
        return self.bridge_mode or self.upstream_kafka_mode

    def connection_slots(self) -> int:
        """Connections every listener together may hold (each one a descriptor)."""
        return sum(self.http_max_connections if spec.protocol == "metrics"
                   else self.max_connections for spec in self.listener_specs())

    def listener_specs(self) -> list[ListenerSpec]:
        """Every listener to open (those with an empty address are off), in the order
        metrics, tank, figg, kafka, http, then the [listeners.NAME] ones; a ConfigError
        naming the key when a TLS setting lacks its pair."""
        listen = {name: getattr(self, attr) for name, attr in LISTEN.items()}
        if self.tls_client_ca and not self.tls_cert and not any(
                t.tls_cert for t in self.listeners.values()):
            raise ConfigError("tls.client_ca: mutual TLS needs a certificate: set tls.cert "
                              "and tls.key (or --tls-cert, --tls-key)")
        specs = []
        names = [*listen, *(n for n in self.listeners if n not in listen)]
        for name in names:
            table = self.listeners.get(name, ListenerTable())
            if name in listen:
                protocol, address, key = name, listen[name], f"listen.{name}"
            else:
                protocol, address = table.protocol or "", table.address or ""
                key = f"listeners.{name}.address"
            if address:
                spec = ListenerSpec(name, protocol, address, key, *self._tls_of(name, table))
                if ("PLAIN" in table.sasl_mechanisms and spec.tls is None
                        and not table.sasl_plain_without_tls):
                    raise ConfigError(
                        f"listeners.{name}.sasl_mechanisms: PLAIN sends passwords in the "
                        "clear: give the listener TLS, or set "
                        f"listeners.{name}.sasl_plain_without_tls = true")
                specs.append(spec)
        return specs

    def _tls_of(self, name: str, table: ListenerTable) -> tuple[TLSFiles | None, str]:
        where = f"listeners.{name}"
        own = table.tls_cert is not None
        cert = table.tls_cert or (Path(self.tls_cert) if self.tls_cert else None)
        key = table.tls_key or (Path(self.tls_key) if self.tls_key else None)
        ca = table.tls_client_ca or (Path(self.tls_client_ca) if self.tls_client_ca
                                     else None)
        cert_key = f"{where}.tls_cert" if own else "tls.cert"
        if table.tls is False:
            return None, ""
        if cert is None and key is None:
            if table.tls_client_ca is not None:
                raise ConfigError(f"{where}.tls_client_ca: mutual TLS needs a certificate: "
                                  f"set {where}.tls_cert and tls_key (or tls.cert, tls.key)")
            if table.tls is True:  # asked for: never serve it plain instead
                raise ConfigError(f"{where}.tls: TLS asked for but no certificate: set "
                                  f"{where}.tls_cert and tls_key (or tls.cert, tls.key)")
            return None, ""
        if cert is None:
            raise ConfigError(f"{f'{where}.tls_key' if table.tls_key else 'tls.key'}: "
                              "a key without a certificate: set tls_cert as well")
        if key is None:
            raise ConfigError(f"{cert_key}: a certificate without its key: set "
                              f"{f'{where}.tls_key' if own else 'tls.key'} as well")
        return TLSFiles(cert, key, ca), cert_key

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with some settings changed (each parsed like the config file's)."""
        parsed: dict[str, Any] = {}  # each of its setting's type
        for attr, value in changes.items():
            if attr not in _BY_ATTR:
                raise ConfigError(f"unknown setting {attr!r}")
            parsed[attr] = _parse_option(_BY_ATTR[attr], value)
        return replace(self, **parsed)


#: Every setting, in the order of :class:`Settings`' fields (made from them).
OPTIONS: tuple[Option, ...] = tuple(
    Option(f.metadata["key"], f.name, f.metadata["parse"],
           f.default_factory() if callable(f.default_factory) else f.default,
           f.metadata["help"], f.metadata["flag"])
    for f in fields(Settings))
_BY_ATTR = {option.attr: option for option in OPTIONS}
_BY_KEY = {option.key: option for option in OPTIONS}


def option_of(key: str) -> Option:
    """The declaration of setting ``key`` (``section.name``); KeyError when none."""
    return _BY_KEY[key]

#: The attribute of each listener's address setting (``listen.NAME``), by listener name:
#: metrics first, then the protocol listeners in the order of PROTOCOLS (a KeyError here
#: when a protocol has no ``listen.`` setting).
LISTEN: Final = {name: _BY_KEY[f"listen.{name}"].attr
                 for name in sorted(PROTOCOLS, key=lambda name: name != "metrics")}


def _parse_option(option: Option, value: object) -> object:
    try:
        return option.parse(value)
    except ConfigError:
        raise  # already names the key (and the entry of a table)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{option.key}: {exc} (got {value!r})") from None


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    known_tables = {o.key for o in OPTIONS
                    if o.parse in (_topic_config, _listener_tables, _topic_codecs)}
    flat: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and key not in known_tables:
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def settings_from_mapping(table: Mapping[str, Any]) -> Settings:
    """Settings from a decoded TOML document; unknown keys are errors."""
    values: dict[str, Any] = {}
    for key, value in _flatten(table).items():
        option = _BY_KEY.get(key)
        if option is None:
            raise ConfigError(f"{key}: unknown setting")
        values[option.attr] = _parse_option(option, value)
    return Settings(**values)


def load_settings(config_file: Path | None = None,
                  overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from an optional TOML file, then flag overrides (attr -> raw value)."""
    settings = Settings()
    if config_file is not None:
        try:
            with open(config_file, "rb") as f:
                document = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
        settings = settings_from_mapping(document)
    if overrides:
        settings = settings.with_overrides(
            **{k: v for k, v in overrides.items() if v is not None})
    return settings


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option that has one; unset flags stay None (no override)."""
    for option in OPTIONS:
        if option.flag is None:
            continue
        kwargs: dict[str, Any] = {"dest": option.attr, "default": None,
                                  "help": f"{option.help} [{option.key}]"}
        choices = getattr(option.parse, "choices", None)
        if choices:
            kwargs["choices"] = choices
        if option.parse is _addresses:
            kwargs["action"] = "append"
        parser.add_argument(option.flag, **kwargs)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, by attribute name."""
    return {o.attr: getattr(args, o.attr) for o in OPTIONS
            if o.flag is not None and getattr(args, o.attr, None) is not None}


def reference_table() -> str:
    """The configuration reference as a Markdown table (kept in docs/configuration.md)."""
    rows = ["| key | flag | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        default = option.default
        if isinstance(default, Path):
            default = str(default)
        shown = "(none)" if default in ((), {}, "", None) else f"`{default}`"
        rows.append(f"| `{option.key}` | {f'`{option.flag}`' if option.flag else ''} "
                    f"| {shown} | {option.help} |")
    return "\n".join(rows)
