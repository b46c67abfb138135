"""Settings for the GPU portal, read from the environment.

Development defaults need no server: SQLite under ``var/``, Celery on an SQLite broker,
the embedded sandbox cluster. Set ``DATABASE_URL`` and ``REDIS_URL`` (or ``CELERY_BROKER_URL``)
for PostgreSQL and Redis. ``PORTAL_ENV=production`` refuses to start with ``DEBUG`` on or the
development secret key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PORTAL_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEV_SECRET_KEY = "dev-insecure-secret-key-change-me"
PORTAL_ENV = os.environ.get("PORTAL_ENV", "development")
SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
# Soft rotation (docs/operations.md): the previous key(s), comma-separated; sessions, password-reset and invitation
# links signed with them stay valid while they are listed (and kubeconfigs encrypted with a key derived from them
# stay readable: portal/crypto.py).
SECRET_KEY_FALLBACKS = [k.strip() for k in os.environ.get("SECRET_KEY_FALLBACKS", "").split(",") if k.strip()]
DEBUG = env_bool("DEBUG", PORTAL_ENV != "production")
# With DEBUG on, a 404 is still the portal's own page (portal/not_found.py); DEBUG_404=1 shows Django's debug page
# (every URL pattern) instead, for work on the URL configuration.
DEBUG_404 = env_bool("DEBUG_404", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

if PORTAL_ENV == "production":
    if DEBUG:
        raise ImproperlyConfigured("PORTAL_ENV=production refuses to start with DEBUG on.")
    if SECRET_KEY == DEV_SECRET_KEY or len(SECRET_KEY) < 32:
        raise ImproperlyConfigured("PORTAL_ENV=production needs SECRET_KEY set to a random value of 32+ characters.")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "guardian",
    "django_htmx",
    "portal",  # no models: the rollups command (portal/management) and the seams every app shares
    "tenants",
    "quotas",
    "workloads",
    "billing",
    "maintenance",
    "insights",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

# First: the request id (portal/logs.py), then the probes' answers (portal/health.py), before the host check,
# the HTTPS redirect, sessions and logins.
MIDDLEWARE[:0] = ["portal.logs.RequestIdMiddleware", "portal.health.HealthMiddleware"]
# Then /metrics (portal/prometheus.py), answered before the host check like the probes; it times the rest.
MIDDLEWARE.insert(MIDDLEWARE.index("portal.health.HealthMiddleware") + 1, "portal.prometheus.MetricsMiddleware")

# The portal's 404 page with DEBUG on too, unless DEBUG_404 (portal/not_found.py); last, so it sees the view's Http404.
MIDDLEWARE.append("portal.not_found.NotFoundPageMiddleware")

# NUL characters (PostgreSQL cannot store them) are refused before sessions or tokens are looked up:
# 404 in a path, 400 in a query string, header or JSON body (portal/inputs.py).
MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.sessions.middleware.SessionMiddleware"), "portal.inputs.NulGuardMiddleware")

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        # Django's, letting go of a page's context once it is written (portal/template_backend.py).
        "BACKEND": "portal.template_backend.DjangoTemplates",
        "NAME": "django",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
            ],
        },
    },
    {
        # The hot pages' repeated parts (a list's rows): Jinja2, compiled to Python (portal/jinja_env.py).
        "BACKEND": "django.template.backends.jinja2.Jinja2",
        "DIRS": [BASE_DIR / "templates" / "jinja2"],
        "APP_DIRS": False,
        "OPTIONS": {"environment": "portal.jinja_env.environment", "autoescape": True},
    },
]
# Django's widget templates, with inputs, text areas and selects written in Python (the same HTML; docs/performance.md).
FORM_RENDERER = "portal.forms_render.FastTemplates"

_DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'portal.sqlite3'}"
# Persistent connections (seconds; 0: one per request): a new PostgreSQL connection costs a request
# ~17 ms (docs/performance.md), so a server keeps its connection 60 s by default and checks it is alive
# before reusing it. SQLite opens a file, which costs nothing: 0 unless DB_CONN_MAX_AGE says otherwise.
_CONN_MAX_AGE = os.environ.get("DB_CONN_MAX_AGE", "0" if _DATABASE_URL.startswith("sqlite") else "60")
if not (_CONN_MAX_AGE.isascii() and _CONN_MAX_AGE.isdecimal()):
    raise ImproperlyConfigured(f"DB_CONN_MAX_AGE={_CONN_MAX_AGE!r}: a whole number of seconds (0: a connection per request).")
DATABASES = {
    "default": dj_database_url.parse(_DATABASE_URL, conn_max_age=int(_CONN_MAX_AGE), conn_health_checks=True)
}
# PostgreSQL: the hottest reads (portal/compiled.py) run as prepared statements, planned once per connection.
# DB_PREPARE=0 turns that off, for a transaction-mode pooler that cannot keep them (PgBouncer before 1.21).
DB_PREPARE = os.environ.get("DB_PREPARE", "1").strip().lower() not in ("0", "false", "no", "off")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker) share the file: wait for locks instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
    # Tests use a file too (not Django's in-memory default), so a worker subprocess or a second
    # thread's connection sees the same test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-portal.sqlite3")}
# One test run's names never collide with another's on the same servers: `make test` gives each
# run an id, which names its PostgreSQL test databases and prefixes its Redis keys.
TEST_RUN_ID = os.environ.get("PORTAL_TEST_RUN_ID", "")
if TEST_RUN_ID and DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{TEST_RUN_ID}"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Runtime vs migration role (docs/security.md): the portal runs as DATABASE_URL's role, which owns no
# table (``manage.py db_runtime_role`` creates it: the audit log is append-only for it); migrations
# run as the owner: ``manage.py migrate --database migrate`` with DATABASE_MIGRATE_URL.
if os.environ.get("DATABASE_MIGRATE_URL"):
    DATABASES["migrate"] = dj_database_url.parse(os.environ["DATABASE_MIGRATE_URL"])
    DATABASES["migrate"]["TEST"] = {"MIRROR": "default"}

AUTHENTICATION_BACKENDS = [
    # Django's ModelBackend behind the login throttle (both the portal's and the admin's sign-in).
    "tenants.throttle.ThrottledModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user row

# Single sign-on with OpenID Connect (tenants/oidc.py; README "Single sign-on"): on when OIDC_ISSUER and
# OIDC_CLIENT_ID are set. The endpoints come from the issuer's discovery document (cached), unless set here.
OIDC_ISSUER = os.environ.get("OIDC_ISSUER", "")
OIDC_PROVIDER_NAME = os.environ.get("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_RP_CLIENT_ID = os.environ.get("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = os.environ.get("OIDC_CLIENT_SECRET", "")
OIDC_RP_SCOPES = os.environ.get("OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = os.environ.get("OIDC_SIGN_ALGO", "RS256")
OIDC_GROUPS_CLAIM = os.environ.get("OIDC_GROUPS_CLAIM", "groups")
OIDC_USERNAME_CLAIM = os.environ.get("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_EMAIL_CLAIM = os.environ.get("OIDC_EMAIL_CLAIM", "email")
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = os.environ.get("OIDC_JWKS_URI", "")
OIDC_OP_LOGOUT_ENDPOINT = os.environ.get("OIDC_END_SESSION_ENDPOINT", "")
OIDC_DISCOVERY_TTL = int(os.environ.get("OIDC_DISCOVERY_TTL", "3600"))
OIDC_CLOCK_SKEW = int(os.environ.get("OIDC_CLOCK_SKEW", "60"))
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True  # the logout's id_token_hint (sessions are server-side)
OIDC_TIMEOUT = 10
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
AUTHENTICATION_BACKENDS.append("tenants.oidc.PortalOIDCBackend")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# The image collects static files at build time into STATIC_ROOT (deploy/Containerfile); whitenoise serves them.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or VAR_DIR / "staticfiles")

# Cookies and transport
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = PORTAL_ENV == "production"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
if PORTAL_ENV == "production":
    # Production sits behind TLS (docs/security.md): the proxy says so in X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))  # one year
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)

# Content-Security-Policy (Django's own middleware): scripts and styles only from the portal itself,
# inline ones only with the request's nonce ({{ csp_nonce }}); no plugins, frames or foreign forms.
# The API docs pages get their own policy (portal/urls.py).
from django.utils.csp import CSP

SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "font-src": [CSP.SELF],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

# The cache backs login throttling and task locks, so every process (web, worker) must share it:
# Redis when configured, else a table in the database (`manage.py createcachetable`; devstack runs it).
REDIS_URL = os.environ.get("REDIS_URL", "")
CACHES = {
    "default": (
        {"BACKEND": "portal.redis_cache.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "portal"}
        if REDIS_URL
        else {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "portal_cache",
              "OPTIONS": {"MAX_ENTRIES": 5000}}
    )
}
LOGIN_THROTTLE_ATTEMPTS = int(os.environ.get("LOGIN_THROTTLE_ATTEMPTS", "5"))
LOGIN_THROTTLE_WINDOW = int(os.environ.get("LOGIN_THROTTLE_WINDOW", "300"))
# LOGIN_THROTTLE_ATTEMPTS counts one username from one address; this, failures from one address for any
# username (password spraying), before the address is paused for everyone (tenants/throttle.py).
LOGIN_THROTTLE_ADDRESS_ATTEMPTS = int(os.environ.get("LOGIN_THROTTLE_ADDRESS_ATTEMPTS", "50"))
# Sign-ups on invitation pages: tries per invitation and per client address within the window (tenants/throttle.py).
SIGNUP_THROTTLE_ATTEMPTS = int(os.environ.get("SIGNUP_THROTTLE_ATTEMPTS", "10"))
SIGNUP_THROTTLE_ADDRESS_ATTEMPTS = int(os.environ.get("SIGNUP_THROTTLE_ADDRESS_ATTEMPTS", "30"))
SIGNUP_THROTTLE_WINDOW = int(os.environ.get("SIGNUP_THROTTLE_WINDOW", "3600"))
# Password checks one client address may have running at once (a class behind one NAT), and the
# seconds the sign-in form asks to wait when they are all taken (tenants/throttle.py).
LOGIN_THROTTLE_IN_FLIGHT = int(os.environ.get("LOGIN_THROTTLE_IN_FLIGHT", "20"))
LOGIN_THROTTLE_BUSY_RETRY = int(os.environ.get("LOGIN_THROTTLE_BUSY_RETRY", "5"))
# Sessions stay server-side (never signed cookies). With Redis as the cache, ``cached_db`` writes them to the
# database and the cache and reads them from the cache: a signed-in request's session costs no query. portal.sessions
# is Django's ``cached_db`` that fetches the request's cache versions in the same round trip (portal/sessions.py).
if REDIS_URL:
    SESSION_ENGINE = "portal.sessions"

# Celery: Redis when configured, else the embedded broker (portal/broker.py): kombu's SQLAlchemy
# transport on an SQLite file, one transaction per message, no server. Parallel test processes each
# get their own file (with Redis, their own key prefix).
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_BROKER_FILE = VAR_DIR / (f"celery-broker-{_XDIST_WORKER}.sqlite3" if _XDIST_WORKER else "celery-broker.sqlite3")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL or f"portal+sqlite:///{_BROKER_FILE}"
if _XDIST_WORKER and CELERY_BROKER_URL.startswith("redis"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"test-{TEST_RUN_ID}-{_XDIST_WORKER}:"}
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Soft shutdown: on a cold shutdown the worker stops taking tasks and lets running ones finish for up to this many
# seconds, then cancels them; they were never acknowledged (late acks), so the broker hands them out again. The
# image's `worker` role turns SIGTERM into that shutdown (REMAP_SIGTERM=SIGQUIT, 45 s: deploy/entrypoint.py),
# under the pod's terminationGracePeriodSeconds (60 s). 0: off (`make run`: Ctrl-C waits for running tasks).
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = float(os.environ.get("CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT", "0") or 0)
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# Beat is a singleton: only the holder of the "beat" lease sends the schedule (portal/beat.py); a second beat stands
# by and takes over within this many seconds of the holder's death (plus one tick, a third of it). The schedule's
# state lives in the shared cache, not in a file (portal/beat.py).
CELERY_BEAT_SCHEDULER = "portal.beat:SingletonScheduler"
PORTAL_BEAT_LEASE_SECONDS = float(os.environ.get("PORTAL_BEAT_LEASE_SECONDS", "10"))
# /healthz/ready and the ops pages flag the scheduler when its last heartbeat is older than this (portal/health.py).
PORTAL_BEAT_STALE_SECONDS = float(os.environ.get("PORTAL_BEAT_STALE_SECONDS", "60"))
# One status follower per cluster (workloads/status.py): a dead holder's lease lapses after this many seconds.
PORTAL_FOLLOW_LEASE_SECONDS = float(os.environ.get("PORTAL_FOLLOW_LEASE_SECONDS", "30"))
# Federation (docs/federation.md): a cluster unhealthy for longer than this has its pending work re-dispatched
# elsewhere by housekeeping (once per request); a shorter blip moves nothing.
PORTAL_REDISPATCH_AFTER_SECONDS = float(os.environ.get("PORTAL_REDISPATCH_AFTER_SECONDS", "120"))
# Worker and beat processes touch $TMPDIR/portal-<role>.alive this often; `entrypoint.py healthcheck worker|beat`
# fails when the file is older than PORTAL_HEARTBEAT_MAX_AGE seconds (its own environment variable, default 120).
PORTAL_HEARTBEAT_SECONDS = float(os.environ.get("PORTAL_HEARTBEAT_SECONDS", "10"))
CELERY_BEAT_SCHEDULE: dict = {
    # The reconcile period is the drift-repair promise: hand edits are undone within a minute.
    "quotas-reconcile-all": {"task": "quotas.reconcile_all", "schedule": 60.0},
    "quotas-inventory-all": {"task": "quotas.inventory_sync_all", "schedule": 300.0},
    "quotas-requests-expire": {"task": "quotas.quota_requests_expire", "schedule": 60.0},
    # Requests follow the cluster every few seconds (cost grows with changes, not with requests).
    "workloads-requests-sync": {"task": "workloads.tasks.requests_sync_task", "schedule": 5.0},
    "workloads-requests-housekeeping": {"task": "workloads.tasks.requests_housekeeping_task", "schedule": 60.0},
    # Approved requests whose materialization was lost (a killed worker's claim lapsed): queued again within
    # materialize.CLAIM_LEASE + this period (docs/operations.md, "Recovery bounds").
    "workloads-requests-sweep-approved": {"task": "workloads.tasks.requests_sweep_approved_task", "schedule": 10.0},
    # Reminds approvers of what still waits (once per PORTAL_APPROVAL_REMIND_AFTER per request).
    "workloads-approvals-remind": {"task": "workloads.tasks.approvals_remind_task", "schedule": 300.0},
    # Invitation links past their expiry read as expired at once; this writes the status down.
    "tenants-invitations-expire": {"task": "tenants.invitations_expire", "schedule": 3600.0},
    # Finalises and numbers last month's statements once it ended, and closes the month (idempotent).
    "billing-statements-finalise": {"task": "billing.statements_finalise", "schedule": 3600.0},
}

# Email
EMAIL_BACKEND = os.environ.get(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend" if os.environ.get("EMAIL_HOST") else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "gpu-portal@localhost")
# Optional: quota request events are also POSTed there as JSON (after commit, 3 s timeout; failures logged).
PORTAL_WEBHOOK_URL = os.environ.get("PORTAL_WEBHOOK_URL", "")


def _duration_seconds(name: str, text: str) -> int:
    """``4h``, ``30m``, ``90s``, ``1d`` or plain seconds; ``0`` or empty: off. Anything else refuses to start."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    if not text:
        return 0
    if not (number.isascii() and number.isdecimal()):
        raise ImproperlyConfigured(f"{name}={text!r}: a duration is N, Ns, Nm, Nh or Nd (0: off).")
    return int(number) * units[unit]


# Approvers are reminded of a request still waiting for their decision this long after it arrived (and again
# after each such period); 0 turns reminders off.
PORTAL_APPROVAL_REMIND_AFTER = _duration_seconds(
    "PORTAL_APPROVAL_REMIND_AFTER", os.environ.get("PORTAL_APPROVAL_REMIND_AFTER", "4h")
)
# Invitations by email (tenants): how long a link works, and the address links point at. Empty base
# URL: the address the inviting request came to (behind a proxy, set it).
_invitation_days = os.environ.get("PORTAL_INVITATION_DAYS", "7").strip()
if not _invitation_days.isdecimal() or not 1 <= int(_invitation_days) <= 90:
    raise ImproperlyConfigured(f"PORTAL_INVITATION_DAYS must be a whole number of days from 1 to 90, not {_invitation_days!r}.")
PORTAL_INVITATION_DAYS = int(_invitation_days)

# Billing: the price list's currency (ISO 4217); every price is in it (docs/billing.md).
BILLING_CURRENCY = os.environ.get("BILLING_CURRENCY", "EUR").strip().upper()
if not re.fullmatch(r"[A-Z]{3}", BILLING_CURRENCY):
    raise ImproperlyConfigured(f"BILLING_CURRENCY must be a three-letter currency code (ISO 4217), not {BILLING_CURRENCY!r}.")
PORTAL_BASE_URL = os.environ.get("PORTAL_BASE_URL", "").rstrip("/")
# What the links in emails start with (portal.notify.portal_link): PORTAL_BASE_URL, else the address `make run`
# prints (PORTAL_HOST / PORTAL_PORT), so a mail client can open them.
PORTAL_LINK_BASE_URL = PORTAL_BASE_URL or (
    f"http://{os.environ.get('PORTAL_HOST') or '127.0.0.1'}:{os.environ.get('PORTAL_PORT') or '8000'}"
)

# One-time form tokens (portal/forms.py): how long a sent form's result is remembered for replays.
PORTAL_FORM_TOKEN_SECONDS = 24 * 3600

# Fernet key(s) for kubeconfigs at rest (comma-separated for rotation); derived from SECRET_KEY if unset.
PORTAL_ENCRYPTION_KEY = os.environ.get("PORTAL_ENCRYPTION_KEY", "")

# Where notebooks are reachable from browsers: the host of the ingress route that asks /notebooks/auth/ first
# (docs/notebooks.md); empty: the portal itself (its /notebooks/<id>/ proxy). Links never carry a token.
PORTAL_NOTEBOOK_BASE_URL = os.environ.get("PORTAL_NOTEBOOK_BASE_URL", "")

# Inference services (docs/inference.md): the domain their routes live under (an Ingress per service at
# req-<id>-<namespace>.<domain>, checked by /inference/auth/<id>/ first; empty: no route, the portal's own
# /inference/<id>/v1/... proxy only), the ingress class, and the rate each API key may call at.
PORTAL_INFERENCE_DOMAIN = os.environ.get("PORTAL_INFERENCE_DOMAIN", "").strip().strip(".")
PORTAL_INFERENCE_INGRESS_CLASS = os.environ.get("PORTAL_INFERENCE_INGRESS_CLASS", "")
INFERENCE_RATE_KEY = os.environ.get("INFERENCE_RATE_KEY", "600/min")
# Where a cluster serves the Gateway API (gateway.networking.k8s.io HTTPRoute), the route is an HTTPRoute attached to
# this Gateway ("namespace/name"), its forward auth the ExternalAuth filter to the portal's own Service
# ("namespace/name:port"); where it serves KEDA (keda.sh ScaledObject), the autoscaler is a ScaledObject whose
# Prometheus trigger asks this server (docs/inference.md).
PORTAL_INFERENCE_GATEWAY = os.environ.get("PORTAL_INFERENCE_GATEWAY", "gateway-system/inference").strip()
PORTAL_INFERENCE_AUTH_SERVICE = os.environ.get("PORTAL_INFERENCE_AUTH_SERVICE", "gpu-portal/gpu-portal-web:80").strip()
PORTAL_KEDA_PROMETHEUS_URL = os.environ.get(
    "PORTAL_KEDA_PROMETHEUS_URL", os.environ.get("PROMETHEUS_URL", "") or "http://prometheus-operated.monitoring:9090").strip()

# Finished training Jobs (batch/v1 and Volcano) are deleted by the cluster this many seconds after they end
# (ttlSecondsAfterFinished); the portal keeps the request's record. Empty: never.
_job_ttl = os.environ.get("WORKLOADS_JOB_TTL_SECONDS", "3600").strip()
WORKLOADS_JOB_TTL_SECONDS = int(_job_ttl) if _job_ttl else None

# Kubernetes: the sandbox cluster's kubeconfig by default.
KUBECONFIG = os.environ.get("PORTAL_KUBECONFIG", str(VAR_DIR / "sandbox.kubeconfig"))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.api.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "portal.inputs.FilterBackend",
        "rest_framework.filters.OrderingFilter",
        "portal.inputs.SearchFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.exception_handler",
    "DEFAULT_VERSIONING_CLASS": None,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_THROTTLE_CLASSES": ["portal.throttles.UserRateThrottle"],
    # DRF's parsers, with JSON that cannot be stored (lone surrogates, nesting too deep) a 400 (portal/inputs.py).
    "DEFAULT_PARSER_CLASSES": [
        "portal.inputs.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
# API rate limits per token (or per signed-in user), e.g. "1200/min"; empty: no limit. Submissions
# (POST /api/v1/requests/) have their own, stricter one on top. Counted in the default cache.
API_RATE_USER = os.environ.get("API_RATE_USER", "1200/min")
API_RATE_SUBMIT = os.environ.get("API_RATE_SUBMIT", "120/min")
for _rate_name in ("API_RATE_USER", "API_RATE_SUBMIT"):
    _rate = globals()[_rate_name]
    _count, _, _period = _rate.partition("/")
    if _rate and not (_count.isascii() and _count.isdecimal() and _period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(f"{_rate_name}={_rate!r}: a rate is N/s, N/min, N/hour or N/day (empty: no limit).")

# The OpenAPI schema (/api/schema/) and the docs pages (/api/docs/, /api/redoc/): readable by anyone, or
# (off) by signed-in users and tokens only. Default: public in development, login required in production.
PORTAL_SCHEMA_PUBLIC = env_bool("PORTAL_SCHEMA_PUBLIC", PORTAL_ENV != "production")

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Portal API",
    "DESCRIPTION": "Self-service GPU portal: tenants, projects, memberships, API tokens, audit log.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI and Redoc assets come from drf-spectacular-sidecar: served by us, no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One schema name per choice set that several fields share.
    "ENUM_NAME_OVERRIDES": {
        "TemplateKindEnum": "workloads.models.TemplateKind",
        "FlavorKindEnum": "quotas.models.Flavor.Kind",
        "PriorityEnum": "workloads.models.Priority",
        # Two "state" choice sets: keep the requests' name as it was, name the architecture changes' own.
        "StateEnum": "workloads.models.RequestState",
        "ArchitectureChangeStateEnum": "quotas.models.ArchitectureChange.State",
        "ArchitectureEnum": "quotas.models.Architecture",
        # Two "topology" choice sets: a cluster's (ops) and a request's placement.
        "ClusterTopologyEnum": "quotas.models.CLUSTER_TOPOLOGIES",
        "RequestTopologyEnum": "workloads.models.REQUEST_TOPOLOGIES",
        # Two "role" choice sets: a member's (kept as it was) and a cluster's MultiKueue role.
        "RoleEnum": "tenants.models.Role",
        "ClusterRoleEnum": "quotas.models.CLUSTER_ROLES",
        "StatementStatusEnum": "billing.models.Statement.Status",
        "BillingModeEnum": "billing.models.BillingProfile.Mode",
        "MigChangeStatusEnum": "maintenance.models.MigChange.Status",
        "MigChangeStepEnum": "maintenance.models.MigChange.Step",
        "MigChangeStepOutcomeEnum": "maintenance.models.MigChangeStep.Outcome",
    },
    # Error responses, token auth and response headers are documented by one hook (portal/api.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "portal.api.schema_postprocess"],
    # The API is JSON: form encodings are accepted by DRF's parsers but not offered in the schema.
    "PARSER_WHITELIST": ["rest_framework.parsers.JSONParser"],
}

# Logs (portal/logs.py): LOG_FORMAT=json writes one JSON object per line to stdout with the request id (the
# image's default), plus one access line per request; anything else keeps the readable lines of `make run`.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").strip().lower()
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: plain or json.")
PORTAL_ACCESS_LOG = env_bool("PORTAL_ACCESS_LOG", LOG_FORMAT == "json")
from portal.logs import json_stdio, logging_config

if LOG_FORMAT == "json":
    json_stdio()  # print()s, warnings and Celery's banner come out as JSON lines too (portal/logs.py)
LOGGING = logging_config(json_format=LOG_FORMAT == "json", level=os.environ.get("LOG_LEVEL", "INFO"))
# With JSON logs the Celery worker keeps Django's logging (its own format would break the JSON lines).
CELERY_WORKER_HIJACK_ROOT_LOGGER = LOG_FORMAT != "json"

VAR_DIR.mkdir(parents=True, exist_ok=True)
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Ownership of cluster objects (docs/ownership.md). Every object the portal writes carries
# app.kubernetes.io/managed-by=gpu-portal and gpuportal.dev/installation=<this id>; the portal never
# writes into, labels or deletes what lacks both (unless ops adopt it explicitly).
PORTAL_INSTALLATION_ID = os.environ.get("PORTAL_INSTALLATION_ID", "gpu-portal")
# "namespace/name" of the portal's ServiceAccount on the clusters it manages: each project namespace gets a
# RoleBinding of the ClusterRole gpu-portal-namespaced (Secrets) to it (docs/security.md). Empty: none written.
PORTAL_SERVICE_ACCOUNT = os.environ.get("PORTAL_SERVICE_ACCOUNT", "")
# Namespace names no project may use, on top of the built-in list in quotas/manifests.py (comma-separated;
# a trailing "*" matches a prefix, e.g. "team-infra-*").
PORTAL_RESERVED_NAMESPACES = [n.strip() for n in os.environ.get("PORTAL_RESERVED_NAMESPACES", "").split(",") if n.strip()]
# An archived project's namespace (and what is in it) stays this many days before housekeeping deletes it.
PORTAL_NAMESPACE_RETENTION_DAYS = int(os.environ.get("PORTAL_NAMESPACE_RETENTION_DAYS", "7"))
CELERY_BEAT_SCHEDULE["quotas-namespace-housekeeping"] = {"task": "quotas.namespace_housekeeping", "schedule": 3600.0}
# Budget alerts (once per threshold and month; the check is one aggregate query): docs/billing.md.
CELERY_BEAT_SCHEDULE["billing-budgets-check"] = {"task": "billing.budgets_check", "schedule": 60.0}
# Every rollup (costs per day, requests per day, samples per hour; each period replaced whole): portal/rollups.py.
CELERY_BEAT_SCHEDULE["rollups-refresh"] = {"task": "portal.rollups_refresh", "schedule": 3600.0}
# The weekly metrics digest to tenant admins (claimed once per tenant and week; hourly so a missed Monday catches up).
CELERY_BEAT_SCHEDULE["insights-digests-send"] = {"task": "insights.digests_send", "schedule": 3600.0}

# Prometheus (portal/prometheus.py, docs/insights.md "Prometheus"): /metrics answers only with
# "Authorization: Bearer <METRICS_TOKEN>"; unset, only loopback with DEBUG on. PROMETHEUS_MULTIPROC_DIR (an
# environment variable the entry points set) sums the processes' counters. The collectors below read the database
# at scrape time (dotted paths: portal imports no app).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
PROMETHEUS_COLLECTORS = ["insights.prometheus.DatabaseCollector", "tenants.anchor.AnchorCollector"]
# The audit chain's anchor (docs/security.md): its head, published after each commit outside the database, which
# ``manage.py audit_verify`` compares the chain with. A file ("" turns it off; each test worker has its own) and,
# with Redis, a key.
AUDIT_ANCHOR_FILE = os.environ.get(
    "PORTAL_AUDIT_ANCHOR_FILE", str(VAR_DIR / (f"audit-anchor-{_XDIST_WORKER}.json" if _XDIST_WORKER else "audit-anchor.json")))
AUDIT_ANCHOR_REDIS_KEY = os.environ.get(
    "PORTAL_AUDIT_ANCHOR_REDIS_KEY", f"test-{TEST_RUN_ID}-{_XDIST_WORKER}:gpuportal:audit:anchor" if TEST_RUN_ID else "gpuportal:audit:anchor")
# MIG changes (docs/mig-changes.md): a change needs an approval by an ops person other than its proposer; an
# installation with a single ops person turns this on to let the proposer approve their own change (audited).
PORTAL_MIG_SINGLE_OPS = env_bool("PORTAL_MIG_SINGLE_OPS", False)
# How long a window waits for the MIG manager (per layout change) before it rolls back, in seconds.
PORTAL_MIG_RECONFIGURE_TIMEOUT = _duration_seconds("PORTAL_MIG_RECONFIGURE_TIMEOUT",
                                                   os.environ.get("PORTAL_MIG_RECONFIGURE_TIMEOUT", "20m"))
# The window's sweep (beat): starts due changes and moves running ones on (each also re-queues itself).
CELERY_BEAT_SCHEDULE["maintenance-mig-changes-sweep"] = {"task": "maintenance.mig_changes_sweep", "schedule": 60.0}
# Samples of queues and GPU pools for the acceptance metrics, one per 5-minute slot (docs/insights.md).
CELERY_BEAT_SCHEDULE["insights-samples-take"] = {"task": "insights.samples_take", "schedule": 300.0}
# Measured GPU use (docs/measured-use.md): a Prometheus-compatible query API that scrapes NVIDIA's DCGM exporter
# ("" = none: the measured figures say so); `make run` points it at the sandbox. One sample per running request and
# 5-minute slot (insights/measured.py). A sample below MEASURED_IDLE_PERCENT GPU utilisation counts as idle.
PROMETHEUS_URL = os.environ.get("PROMETHEUS_URL", "").strip()
PROMETHEUS_TOKEN = os.environ.get("PROMETHEUS_TOKEN", "")
# One Prometheus over several clusters: the label naming the cluster on every series (commonly "cluster", an external
# label or a relabelling); each cluster's value is Cluster.prometheus_cluster (empty: its name). "" = one
# Prometheus per cluster, no such label.
PROMETHEUS_CLUSTER_LABEL = os.environ.get("PROMETHEUS_CLUSTER_LABEL", "").strip()
if PROMETHEUS_CLUSTER_LABEL and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", PROMETHEUS_CLUSTER_LABEL):
    raise ImproperlyConfigured(f"PROMETHEUS_CLUSTER_LABEL must be a Prometheus label name, not {PROMETHEUS_CLUSTER_LABEL!r}.")
MEASURED_IDLE_PERCENT = float(os.environ.get("MEASURED_IDLE_PERCENT", "5"))
CELERY_BEAT_SCHEDULE["insights-measured-take"] = {"task": "insights.measured_take", "schedule": 300.0}
# Scheduling success (insights): a request counts as scheduled in time when admitted within this many minutes of
# its approval (docs/insights.md).
_admit_target = os.environ.get("INSIGHTS_ADMIT_TARGET_MINUTES", "10").strip()
if not (_admit_target.isdecimal() and 1 <= int(_admit_target) <= 10080):
    raise ImproperlyConfigured(f"INSIGHTS_ADMIT_TARGET_MINUTES must be a whole number of minutes (1 to 10080), not {_admit_target!r}.")
INSIGHTS_ADMIT_TARGET_MINUTES = int(_admit_target)

