"""Meridian's one settings module: everything comes from the environment, with defaults
that let `make run` work on a fresh machine (SQLite, local Redis, demo mode)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from fleet.private_files import ensure_private, write_private
from meridian.env import (
    SQLITE_CONN_MAX_AGE,
    SQLITE_OPTIONS,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_map,
    env_str,
    parse_database_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("MERIDIAN_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)  # new ones: the owner's alone


def _secret_key() -> str:
    """The configured key, or one generated once and kept in var/ so sessions survive restarts."""
    configured = env_str("MERIDIAN_SECRET_KEY", "")
    if configured:
        return configured
    path = VAR_DIR / "secret_key"
    if not path.exists():
        write_private(path, secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("MERIDIAN_DEBUG", False)
ALLOWED_HOSTS = env_list("MERIDIAN_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("MERIDIAN_CSRF_TRUSTED_ORIGINS", [])

# "daphne" is not an app here: its AppConfig imports daphne.server (Twisted and its
# reactor) into every process, every manage.py command included, only to replace
# `runserver` with an ASGI one.  The console runs under the `daphne` command
# (`daphne meridian.asgi:application`, as `make run` starts it), which needs no app;
# Django's own `runserver` serves plain HTTP pages but not the live WebSocket views.
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "fleet",
    "workers",
    "console",
    "ops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# A balancer's port serves the data plane only; the console and admin, the console's.
ROOT_URLCONF = "meridian.urls_balancer" if env_str("MERIDIAN_BALANCER", "") else "meridian.urls"
ASGI_APPLICATION = "meridian.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = env_str("DATABASE_URL", "")
if _database_url:
    DATABASES = {"default": parse_database_url(_database_url)}
else:
    # SQLite would create the file with the umask's mode (0644); its WAL files copy it.
    ensure_private(VAR_DIR / "meridian.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "meridian.sqlite3",
            # Several processes share the file (meridian.env.SQLITE_OPTIONS says how).
            "OPTIONS": dict(SQLITE_OPTIONS),
            "CONN_MAX_AGE": SQLITE_CONN_MAX_AGE,
            # A file (child processes of integration tests open it by path), one per
            # test run so two suites on one checkout never drop each other's tables.
            "TEST": {"NAME": VAR_DIR / f"test_meridian_{os.getpid()}.sqlite3"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
LOGIN_URL = "/admin/login/"
# daphne serves /static/ itself unless a front proxy does (MERIDIAN_SERVE_STATIC=false).
MERIDIAN_SERVE_STATIC = env_bool("MERIDIAN_SERVE_STATIC", True)

# Request bodies: the proxy enforces its own limit (413) before Django's form parsing.
MERIDIAN_MAX_BODY_BYTES = env_int("MERIDIAN_MAX_BODY_BYTES", 4 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = MERIDIAN_MAX_BODY_BYTES + 1024
# Slow or stalled clients on a balancer's port (uvicorn, routing.http_protocol): the
# request line and headers must arrive within the header timeout, a body may pause at
# most the body timeout between chunks, and an idle keep-alive connection closes
# after the keep-alive timeout.  Headers past the byte limit are answered 431.
MERIDIAN_HEADER_TIMEOUT_S = env_float("MERIDIAN_HEADER_TIMEOUT_S", 10.0, minimum=0.1)
MERIDIAN_BODY_TIMEOUT_S = env_float("MERIDIAN_BODY_TIMEOUT_S", 30.0, minimum=0.1)
MERIDIAN_KEEPALIVE_TIMEOUT_S = env_float("MERIDIAN_KEEPALIVE_TIMEOUT_S", 5.0, minimum=0.1)
# Failed API-key attempts a client address may make per window before its requests
# are answered 429 (Retry-After: until the window ends).
MERIDIAN_AUTH_FAILURE_LIMIT = env_int("MERIDIAN_AUTH_FAILURE_LIMIT", 20, minimum=1)
MERIDIAN_AUTH_FAILURE_WINDOW_S = env_float("MERIDIAN_AUTH_FAILURE_WINDOW_S", 60.0, minimum=1.0)
# Per-key limits in Redis (routing.key_limits): the store's timeout, after which limits
# are held per process; how long until Redis is tried again; and a concurrency slot's lease.
MERIDIAN_KEY_LIMITS_TIMEOUT_S = env_float("MERIDIAN_KEY_LIMITS_TIMEOUT_S", 0.25, minimum=0.01)
MERIDIAN_KEY_LIMITS_RETRY_S = env_float("MERIDIAN_KEY_LIMITS_RETRY_S", 1.0, minimum=0.1)
MERIDIAN_KEY_SLOT_LEASE_S = env_float("MERIDIAN_KEY_SLOT_LEASE_S", 900.0, minimum=10.0)
MERIDIAN_MAX_HEADER_BYTES = env_int("MERIDIAN_MAX_HEADER_BYTES", 32768, minimum=1024)

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# meridian.channel_layer: channels-redis with its blocking read (1 s) well inside
# redis-py's 5 s socket timeout, so an idle console socket never times out.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "meridian.channel_layer.ConsoleChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": "meridian:channels"},
    }
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Meridian ---------------------------------------------------------------------------
# Which balancer this process plays (its Balancer.name); empty in the console process.
MERIDIAN_BALANCER = env_str("MERIDIAN_BALANCER", "")
# Demo mode applies the emulated inter-region RTTs to balancer-to-balancer forwarding.
MERIDIAN_DEMO = env_bool("MERIDIAN_DEMO", False)
MERIDIAN_HASH_SEED = env_str("MERIDIAN_HASH_SEED", "meridian")
MERIDIAN_TOKENIZER_JSON = env_str("MERIDIAN_TOKENIZER_JSON", "")
# Each served model's own tokenizer and chat template: model=directory (Hugging Face layout)
# or model=path/to/tokenizer.json.  Models not named use the fallback (routing.model_tokens).
MERIDIAN_MODEL_TOKENIZERS = env_map("MERIDIAN_MODEL_TOKENIZERS")
# LoRA adapters served on a base model's replicas (vLLM --lora-modules): adapter=base-model.
MERIDIAN_LORA_ADAPTERS = env_map("MERIDIAN_LORA_ADAPTERS")
# Prompts longer than this many characters are tokenized in a worker thread.
MERIDIAN_TOKENIZE_THREAD_CHARS = env_int("MERIDIAN_TOKENIZE_THREAD_CHARS", 16384, minimum=0)
# Token ids each model's segment cache keeps (core.segments); 0 turns it off.
MERIDIAN_TOKENIZE_CACHE_TOKENS = env_int("MERIDIAN_TOKENIZE_CACHE_TOKENS", 1_000_000, minimum=0)
# How often a balancer checks topology and API keys in the database (off the hot path):
# one row's token (fleet.topology_change), and every table only when it moved.
MERIDIAN_TOPOLOGY_REFRESH_S = env_float("MERIDIAN_TOPOLOGY_REFRESH_S", 2.0, minimum=0.1)
# ... and every table this often regardless, for writes that bypassed the token.
MERIDIAN_TOPOLOGY_FULL_REFRESH_S = env_float("MERIDIAN_TOPOLOGY_FULL_REFRESH_S", 30.0, minimum=0.1)
# In-process replica /metrics probe period: SP-P selective pushing reads waiting requests
# from it, so it is sub-second (routing.prober).
MERIDIAN_PROBE_INTERVAL_S = env_float("MERIDIAN_PROBE_INTERVAL_S", 0.25, minimum=0.05)
# With no traffic the gap between probe rounds doubles up to this (core.probe_schedule).
MERIDIAN_PROBE_IDLE_INTERVAL_S = env_float("MERIDIAN_PROBE_IDLE_INTERVAL_S", 5.0, minimum=0.05)
MERIDIAN_PROBE_TIMEOUT_S = env_float("MERIDIAN_PROBE_TIMEOUT_S", 1.0, minimum=0.05)
# A probe that times out while the replica's relayed responses brought bytes this
# recently is late, not failed (routing.prober); 0 counts every timeout.
MERIDIAN_PROBE_BUSY_GRACE_S = env_float("MERIDIAN_PROBE_BUSY_GRACE_S", 3.0, minimum=0.0)
MERIDIAN_HEARTBEAT_INTERVAL_S = env_float("MERIDIAN_HEARTBEAT_INTERVAL_S", 1.0, minimum=0.1)
MERIDIAN_HEARTBEAT_TTL_S = env_float("MERIDIAN_HEARTBEAT_TTL_S", 5.0, minimum=0.5)
# The console's live feed: each balancer appends a record to its region's Redis stream
# this often, and the stream keeps about this many (1 s x 4 balancers x 15 min + slack).
MERIDIAN_LIVE_PUBLISH_S = env_float("MERIDIAN_LIVE_PUBLISH_S", 1.0, minimum=0.2)
MERIDIAN_LIVE_STREAM_MAXLEN = env_int("MERIDIAN_LIVE_STREAM_MAXLEN", 4096, minimum=100)
# N processes behind one balancer address (docs/scale-out.md): how many the stack starts
# per region (SO_REUSEPORT), and how they share in-flight counts and the prefix index.
MERIDIAN_PROCESSES = env_int("MERIDIAN_PROCESSES", 2, minimum=1)
MERIDIAN_SHARED_STATE = env_bool("MERIDIAN_SHARED_STATE", True)
MERIDIAN_SHARED_SYNC_S = env_float("MERIDIAN_SHARED_SYNC_S", 0.05, minimum=0.01)
MERIDIAN_SHARED_TIMEOUT_S = env_float("MERIDIAN_SHARED_TIMEOUT_S", 0.25, minimum=0.01)
MERIDIAN_SHARED_PEER_TTL_S = env_float("MERIDIAN_SHARED_PEER_TTL_S", 2.0, minimum=0.1)
MERIDIAN_SHARED_ROUTES_MAXLEN = env_int("MERIDIAN_SHARED_ROUTES_MAXLEN", 4096, minimum=64)
MERIDIAN_SHARED_OUTBOX_MAX = env_int("MERIDIAN_SHARED_OUTBOX_MAX", 4096, minimum=64)
MERIDIAN_SHARED_IDLE_CHECK_S = env_float("MERIDIAN_SHARED_IDLE_CHECK_S", 0.4, minimum=0.0)
MERIDIAN_SHARED_WARM_START_S = env_float("MERIDIAN_SHARED_WARM_START_S", 3.0, minimum=0.0)
# The connect timeout also covers the wait for the event loop to get to the connect: on a
# busy balancer a burst's connects queue behind the burst itself, so it is not tight.
MERIDIAN_UPSTREAM_CONNECT_TIMEOUT_S = env_float("MERIDIAN_UPSTREAM_CONNECT_TIMEOUT_S", 5.0)
# Idle keep-alive connections kept open to every healthy replica (opened after each probe
# round), so a burst on a cold pool does not open one connection per request at once.
MERIDIAN_UPSTREAM_WARM_CONNECTIONS = env_int("MERIDIAN_UPSTREAM_WARM_CONNECTIONS", 8, minimum=0)
MERIDIAN_UPSTREAM_READ_TIMEOUT_S = env_float("MERIDIAN_UPSTREAM_READ_TIMEOUT_S", 300.0)
MERIDIAN_MAX_ATTEMPTS = env_int("MERIDIAN_MAX_ATTEMPTS", 3, minimum=1)
# A retry waits a random time up to min(MAX, BACKOFF * 2^(n-1)) first (core.backoff).
MERIDIAN_RETRY_BACKOFF_S = env_float("MERIDIAN_RETRY_BACKOFF_S", 0.025, minimum=0.0)
MERIDIAN_RETRY_BACKOFF_MAX_S = env_float("MERIDIAN_RETRY_BACKOFF_MAX_S", 0.5, minimum=0.0)
# Per-replica circuit breaker (core.breaker): after a failure the replica is held
# down (doubling while it keeps failing, up to MAX), then READMIT_PROBES good probes in a
# row readmit it.
MERIDIAN_BREAKER_HOLD_DOWN_S = env_float("MERIDIAN_BREAKER_HOLD_DOWN_S", 1.0, minimum=0.0)
MERIDIAN_BREAKER_MAX_HOLD_DOWN_S = env_float("MERIDIAN_BREAKER_MAX_HOLD_DOWN_S", 30.0, minimum=0.0)
MERIDIAN_BREAKER_READMIT_PROBES = env_int("MERIDIAN_BREAKER_READMIT_PROBES", 2, minimum=1)
# Celery beat periods (seconds).
MERIDIAN_PROBE_PERIOD_S = env_float("MERIDIAN_PROBE_PERIOD_S", 5.0, minimum=0.5)
MERIDIAN_PROBE_FAILURE_THRESHOLD = env_int("MERIDIAN_PROBE_FAILURE_THRESHOLD", 2, minimum=1)
MERIDIAN_BALANCER_SYNC_PERIOD_S = env_float("MERIDIAN_BALANCER_SYNC_PERIOD_S", 2.0, minimum=0.5)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("MERIDIAN_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # The openai client logs every request through its own httpx fork.
        "httpx2": {"level": "WARNING"},
    },
}

# --- Regional balancer (routing/) -----------------------------------------------------
# Requests one balancer may have outstanding on one replica before it counts as
# unavailable (SkyLB's SP-O availability rule); then the balancer forwards or answers 429.
MERIDIAN_REPLICA_MAX_OUTSTANDING = env_int("MERIDIAN_REPLICA_MAX_OUTSTANDING", 32, minimum=1)
# Retry-After (seconds) sent with 429 (at capacity) and 503 (nothing healthy) answers.
MERIDIAN_RETRY_AFTER_S = env_int("MERIDIAN_RETRY_AFTER_S", 1, minimum=1)
# A peer balancer is available for forwarding while it reports an available replica and
# at most this many requests in its queue (SkyLB's τ, Algorithm 1 line 12).
MERIDIAN_PEER_QUEUE_BUFFER = env_int("MERIDIAN_PEER_QUEUE_BUFFER", 1, minimum=0)
# Allocations between two young-generation collections in a balancer process, set once
# its runtime is started (routing.lifespan).  At the interpreter's default (700) a
# streamed request's objects outlive several young collections while it is in flight,
# so they are promoted and walked again by the older generations' collections; 20000
# lets most of them die young (docs/performance.md, "Streams: 128 in flight against 32").
MERIDIAN_BALANCER_GC_GEN0 = env_int("MERIDIAN_BALANCER_GC_GEN0", 20_000, minimum=1)

# --- Control plane (workers/, console/drills/) ------------------------------------------
# Celery beat periods (seconds); each entry expires at 80 % of its period (workers.schedule).
MERIDIAN_BALANCER_PROBE_PERIOD_S = env_float("MERIDIAN_BALANCER_PROBE_PERIOD_S", 5.0, minimum=0.5)
MERIDIAN_FAILOVER_PERIOD_S = env_float("MERIDIAN_FAILOVER_PERIOD_S", 2.0, minimum=0.5)
MERIDIAN_ROLLUP_PERIOD_S = env_float("MERIDIAN_ROLLUP_PERIOD_S", 10.0, minimum=1.0)
MERIDIAN_KEY_USAGE_PERIOD_S = env_float("MERIDIAN_KEY_USAGE_PERIOD_S", 10.0, minimum=1.0)
MERIDIAN_ROLLUP_PRUNE_PERIOD_S = env_float("MERIDIAN_ROLLUP_PRUNE_PERIOD_S", 600.0, minimum=1.0)
# Rollups older than this are deleted; the live view only needs the latest (in Redis).
MERIDIAN_ROLLUP_RETENTION_S = env_float("MERIDIAN_ROLLUP_RETENTION_S", 7 * 86400.0, minimum=60.0)
# Workload forecaster (workers.forecasting, PreServe §4.1): its beat, window, history
# read from the rollups (weekly seasonality needs two weeks of it) and refit period.
MERIDIAN_FORECAST_PERIOD_S = env_float("MERIDIAN_FORECAST_PERIOD_S", 600.0, minimum=10.0)
MERIDIAN_FORECAST_WINDOW_S = env_float("MERIDIAN_FORECAST_WINDOW_S", 600.0, minimum=60.0)
MERIDIAN_FORECAST_HISTORY_S = env_float("MERIDIAN_FORECAST_HISTORY_S", 7 * 86400.0, minimum=3600.0)
MERIDIAN_FORECAST_RETRAIN_S = env_float("MERIDIAN_FORECAST_RETRAIN_S", 86400.0, minimum=60.0)
# Demand-aware placement (workers.scaling.regional): the share of a region's forecast
# demand its neighbours may serve, and the farthest (RTT) a region forwards to.
MERIDIAN_PLACEMENT_MAX_SPILL = env_float("MERIDIAN_PLACEMENT_MAX_SPILL", 0.3, minimum=0.0)
MERIDIAN_PLACEMENT_RTT_BUDGET_MS = env_float("MERIDIAN_PLACEMENT_RTT_BUDGET_MS", 100.0, minimum=0.0)
# The queue the worker consumes and tasks go to: separate stacks can share one Redis.
CELERY_TASK_DEFAULT_QUEUE = env_str("MERIDIAN_CELERY_QUEUE", "celery")
# Drills: how often they poll the balancers' /internal/state, and the allowance on top
# of the configured detection periods before "routing did not react" is declared.
MERIDIAN_DRILL_POLL_INTERVAL_S = env_float("MERIDIAN_DRILL_POLL_INTERVAL_S", 0.2, minimum=0.05)
MERIDIAN_DRILL_SLACK_S = env_float("MERIDIAN_DRILL_SLACK_S", 5.0, minimum=0.0)
# Supervisor (`make run`): restarts of an essential child that exits, and the first delay
# (doubled per attempt).  The first delay outlasts heartbeat TTL + sync period, so a
# killed balancer's replicas are handed over first and handed back once it returns.
MERIDIAN_RESTART_ATTEMPTS = env_int("MERIDIAN_RESTART_ATTEMPTS", 5, minimum=0)
MERIDIAN_RESTART_BACKOFF_S = env_float("MERIDIAN_RESTART_BACKOFF_S", 10.0, minimum=0.1)

# --- Selective pushing and cross-region availability (routing/) -------------------------
# A replica probe older than this says nothing about pending requests: SP-P falls back to
# the outstanding cap (MERIDIAN_REPLICA_MAX_OUTSTANDING) until a fresh one arrives.
MERIDIAN_PROBE_STALE_S = env_float("MERIDIAN_PROBE_STALE_S", 2.0, minimum=0.1)
# While requests wait, an SP-P replica held back only by its last probe is probed again at
# once, but not more often than this (so a queue cannot turn into a probe storm).
MERIDIAN_PROBE_MIN_GAP_S = env_float("MERIDIAN_PROBE_MIN_GAP_S", 0.02, minimum=0.0)
# How often each balancer polls its peers' GET /internal/availability, and how old the last
# answer may be before the peer counts as unavailable (routing never waits for Redis).
MERIDIAN_AVAILABILITY_INTERVAL_S = env_float("MERIDIAN_AVAILABILITY_INTERVAL_S", 0.3, minimum=0.05)
MERIDIAN_AVAILABILITY_TTL_S = env_float("MERIDIAN_AVAILABILITY_TTL_S", 2.0, minimum=0.1)


def _internal_token() -> str:
    """Bearer token of balancer-to-balancer endpoints: from the environment, else generated
    once into var/ (like the secret key) so every process of one install shares it."""
    configured = env_str("MERIDIAN_INTERNAL_TOKEN", "")
    if configured:
        return configured
    path = VAR_DIR / "internal_token"
    if not path.exists():
        # Balancers of one install often start together: write aside, then link into
        # place, which fails for all but the first, so they all read the same token.
        draft = VAR_DIR / f"internal_token.{os.getpid()}"
        write_private(draft, secrets.token_urlsafe(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


MERIDIAN_INTERNAL_TOKEN = _internal_token()
# Bearer token Prometheus sends for /metrics (open while empty) and /metrics/cost
# (which also takes the internal token or a staff session).
MERIDIAN_METRICS_TOKEN = env_str("MERIDIAN_METRICS_TOKEN", "")

# --- KV events and anti-entropy (routing/kv_events.py, workers/cache_sync.py) -----------
# How often a balancer applies the KV events it queued to its cache maps (002 §3.3's
# ~100 ms batches), and the Celery beat period of the full cache-state sync (002 §4.4).
MERIDIAN_KV_EVENTS_BATCH_S = env_float("MERIDIAN_KV_EVENTS_BATCH_S", 0.1, minimum=0.01)
MERIDIAN_CACHE_SYNC_PERIOD_S = env_float("MERIDIAN_CACHE_SYNC_PERIOD_S", 5.0, minimum=0.5)
# Stream health (core/kv_stream_health.py): probe intervals in which a replica
# misses prefix-cache queries while no KV event arrives before its stream is "silent".
MERIDIAN_KV_SILENT_PROBES = env_int("MERIDIAN_KV_SILENT_PROBES", 10, minimum=1)
# Hit-rate mismatch detector (core/cache_view_check.py): over a replica's last
# WINDOW requests (once MIN_REQUESTS are in), a share of requests above THRESHOLD whose
# expected and reported cached tokens differ by more than one block means "mismatch".
MERIDIAN_CACHE_MISMATCH_WINDOW = env_int("MERIDIAN_CACHE_MISMATCH_WINDOW", 50, minimum=1)
MERIDIAN_CACHE_MISMATCH_MIN_REQUESTS = env_int(
    "MERIDIAN_CACHE_MISMATCH_MIN_REQUESTS", 10, minimum=1
)
MERIDIAN_CACHE_MISMATCH_THRESHOLD = env_float("MERIDIAN_CACHE_MISMATCH_THRESHOLD", 0.5, minimum=0.0)
# PreServe's request-level load forecast (routing.forecast): the response-length predictor
# (none | session-mean | learned), an optional saved state to start the learned one from
# (manage.py bench predictor --save), the look-ahead horizon L in decode iterations, and
# the seconds per decode iteration assumed until completions teach each replica's own.
MERIDIAN_LENGTH_PREDICTOR = env_str("MERIDIAN_LENGTH_PREDICTOR", "learned")
MERIDIAN_LENGTH_PREDICTOR_STATE = env_str("MERIDIAN_LENGTH_PREDICTOR_STATE", "")
MERIDIAN_LOOKAHEAD_ITERATIONS = env_int("MERIDIAN_LOOKAHEAD_ITERATIONS", 100, minimum=1)
MERIDIAN_SECONDS_PER_ITERATION = env_float("MERIDIAN_SECONDS_PER_ITERATION", 0.02, minimum=0.0001)
# Redis-outage drill: the longest pause it may impose (CLIENT PAUSE is self-healing).
MERIDIAN_DRILL_REDIS_MAX_S = env_float("MERIDIAN_DRILL_REDIS_MAX_S", 120.0, minimum=1.0)

# --- Operator console (console/views, console/live) -------------------------------------
# Each console page gets a live snapshot this often, read from the balancers' streams;
# a balancer with no record for MERIDIAN_LIVE_SILENT_AFTER_S shows "no data since".
MERIDIAN_LIVE_PERIOD_S = env_float("MERIDIAN_LIVE_PERIOD_S", 1.0, minimum=0.2)
MERIDIAN_LIVE_SILENT_AFTER_S = env_float("MERIDIAN_LIVE_SILENT_AFTER_S", 5.0, minimum=1.0)
# plotly.js comes from the installed plotly package (no CDN): console.live.plotly_static.
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "console.live.plotly_static.PlotlyFinder",
]

# -- scaling and cost (workers.scaling, workers.providers, workers.cost) ---------------
# How often beat runs scale_services (autoscaler + placement against the provider).
MERIDIAN_SCALING_PERIOD_S = env_float("MERIDIAN_SCALING_PERIOD_S", 10.0, minimum=0.5)
# Drain before scale-down (workers.draining): a replica leaving the fleet takes no new
# request, is terminated once it holds none (after at least one topology refresh), and
# at the latest after MERIDIAN_DRAIN_DEADLINE_S, cutting what still runs.
MERIDIAN_DRAIN_SETTLE_S = env_float("MERIDIAN_DRAIN_SETTLE_S", 5.0, minimum=0.0)
MERIDIAN_DRAIN_DEADLINE_S = env_float("MERIDIAN_DRAIN_DEADLINE_S", 600.0, minimum=1.0)
# "emulated": launch sim.serve replicas after a cold start; "static": operator-registered
# replicas only (Meridian never launches or terminates); "skypilot": clusters on real
# clouds through SkyPilot (docs/skypilot-provider.md).
MERIDIAN_CLOUD_PROVIDER = env_str("MERIDIAN_CLOUD_PROVIDER", "emulated")
if MERIDIAN_CLOUD_PROVIDER not in {"emulated", "static", "skypilot"}:
    raise ValueError("MERIDIAN_CLOUD_PROVIDER must be 'emulated', 'static' or 'skypilot'")
# The SkyPilot provider: the interpreter of SkyPilot's environment (ops/install_skypilot.sh
# prints it), the zones it may launch in (cloud/region/zone, each also a Zone row), the
# replica's accelerators, engine port, disk, optional image and vLLM release.
MERIDIAN_SKYPILOT_PYTHON = env_str("MERIDIAN_SKYPILOT_PYTHON", "")
MERIDIAN_SKYPILOT_ZONES = env_str("MERIDIAN_SKYPILOT_ZONES", "")
MERIDIAN_SKYPILOT_ACCELERATORS = env_str("MERIDIAN_SKYPILOT_ACCELERATORS", "L4:1")
MERIDIAN_SKYPILOT_PORT = env_int("MERIDIAN_SKYPILOT_PORT", 8000, minimum=1)
MERIDIAN_SKYPILOT_DISK_GB = env_int("MERIDIAN_SKYPILOT_DISK_GB", 256, minimum=1)
MERIDIAN_SKYPILOT_IMAGE_ID = env_str("MERIDIAN_SKYPILOT_IMAGE_ID", "")
MERIDIAN_SKYPILOT_VLLM_VERSION = env_str("MERIDIAN_SKYPILOT_VLLM_VERSION", "0.32.0")
# Spot capacity of the emulated cloud: a SkyPilot spot trace (file or folder) replayed
# at MERIDIAN_CLOUD_TRACE_TIME_SCALE trace seconds per second, else a Poisson model.
MERIDIAN_CLOUD_SPOT_TRACE = env_str("MERIDIAN_CLOUD_SPOT_TRACE", "")
MERIDIAN_CLOUD_TRACE_TIME_SCALE = env_float("MERIDIAN_CLOUD_TRACE_TIME_SCALE", 1.0, minimum=0.001)
MERIDIAN_CLOUD_SPOT_PREEMPTIONS_PER_HOUR = env_float(
    "MERIDIAN_CLOUD_SPOT_PREEMPTIONS_PER_HOUR", 0.0, minimum=0.0
)
# Seconds of notice the emulated cloud gives before a spot preemption (AWS gives 120).
MERIDIAN_CLOUD_PREEMPTION_WARNING_S = env_float(
    "MERIDIAN_CLOUD_PREEMPTION_WARNING_S", 0.0, minimum=0.0
)
# Hourly prices (defaults: AWS p3.2xlarge, spot at its 2020 us-east-1 mean); a folder of
# AWS spot price history JSON overrides the spot price per zone.
MERIDIAN_CLOUD_ON_DEMAND_PRICE = env_float("MERIDIAN_CLOUD_ON_DEMAND_PRICE", 3.06, minimum=0.0)
MERIDIAN_CLOUD_SPOT_PRICE = env_float("MERIDIAN_CLOUD_SPOT_PRICE", 0.918, minimum=0.0)
MERIDIAN_CLOUD_SPOT_PRICE_DATA = env_str("MERIDIAN_CLOUD_SPOT_PRICE_DATA", "")
MERIDIAN_CLOUD_INSTANCE_TYPE = env_str("MERIDIAN_CLOUD_INSTANCE_TYPE", "p3.2xlarge")
# Cold start of an emulated replica: instance provisioning, then model load (§2.3).
MERIDIAN_CLOUD_PROVISION_S = env_float("MERIDIAN_CLOUD_PROVISION_S", 20.0, minimum=0.0)
MERIDIAN_CLOUD_MODEL_LOAD_S = env_float("MERIDIAN_CLOUD_MODEL_LOAD_S", 10.0, minimum=0.0)
# Emulated replicas launched by the cloud run at the demo's engine speed.
MERIDIAN_CLOUD_SIM_TIME_SCALE = env_float("MERIDIAN_SIM_TIME_SCALE", 1.0, minimum=0.001)
# Window of the Cost page, cost_summary and GET /metrics/cost.
MERIDIAN_COST_WINDOW_S = env_float("MERIDIAN_COST_WINDOW_S", 3600.0, minimum=1.0)

# -- the demo stack (manage.py run_demo, `make run`) ------------------------------------
MERIDIAN_HOST = env_str("MERIDIAN_HOST", "127.0.0.1")
MERIDIAN_CONSOLE_PORT = env_int("MERIDIAN_CONSOLE_PORT", 8000, minimum=1)
MERIDIAN_BALANCER_BASE_PORT = env_int("MERIDIAN_BALANCER_BASE_PORT", 8100, minimum=1)
MERIDIAN_REPLICA_BASE_PORT = env_int("MERIDIAN_REPLICA_BASE_PORT", 9100, minimum=1)
MERIDIAN_SIM_PROFILE = env_str("MERIDIAN_SIM_PROFILE", "l4-llama3.1-8b")
MERIDIAN_DEMO_TRAFFIC = env_bool("MERIDIAN_DEMO_TRAFFIC", True)
MERIDIAN_DEMO_TRAFFIC_RATE = env_float("MERIDIAN_DEMO_TRAFFIC_RATE", 0.5, minimum=0.0)
MERIDIAN_DEMO_TRAFFIC_S = env_int("MERIDIAN_DEMO_TRAFFIC_S", 3600, minimum=1)
MERIDIAN_BALANCER_SERVER = env_str("MERIDIAN_BALANCER_SERVER", "uvicorn")
