"""The gateway's one TOML file: server, routes (model id → ordered targets), prices, users.

Keys never live in the file: a hosted target names the environment variable
(``api_key_env``) or systemd credential (``api_key_credential``) that holds its key, and a
literal ``api_key`` is refused. Errors name the file and the key that is wrong.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

from .. import constants
from ..catalog import load_apis
from ..errors import UsageError
from ..tiers.arithmetic import ApiPrices
from .config_users import BUDGET_PERIODS, User, parse_user
from .config_values import (
    CONFIG_DOCS,
    PRICE_KEYS,
    ROUTE_KEYS,
    SERVER_KEYS,
    TARGET_KEYS,
    as_table,
    config_error,
    name_problem,
    positive_int,
    positive_number,
    variable_name,
)
from .dialects import FAMILIES

__all__ = [
    "TIER_NAMES",
    "ServerConfig",
    "Target",
    "Route",
    "User",
    "GatewayConfig",
    "load_config",
    "default_config",
    "BUDGET_PERIODS",
]

#: Most routes, targets per route and users one file may define.
MAX_ROUTES = 1000
MAX_TARGETS = 16
MAX_USERS = 100_000


@dataclass(frozen=True)
class ServerConfig:
    """Where the gateway listens and keeps its SQLite database and logs."""

    #: The address to listen on; anything but loopback needs a gateway key to exist first.
    host: str = constants.DEFAULT_HOST
    #: The TCP port (1 to 65535).
    port: int = constants.GATEWAY_PORT
    #: The directory for the SQLite database, the local key and the logs; left out:
    #: ``$TIERLOCAL_HOME/gateway`` (the unit ``service install gateway`` writes without --config:
    #: /var/lib/tierlocal/gateway).
    state_dir: Path = field(default_factory=lambda: constants.home_dir() / "gateway")
    #: Serve TLS itself with this certificate chain and key (PEM files); else plain HTTP.
    tls_cert: Path | None = None
    #: The certificate's private key (PEM); given with tls_cert or not at all.
    tls_key: Path | None = None
    #: Output tokens reserved (and sent upstream as max_tokens) for a user with a budget
    #: whose request names no max_tokens.
    default_max_tokens: int = constants.GATEWAY_DEFAULT_MAX_TOKENS
    #: Longest request body, in bytes.
    max_body_bytes: int = 8 * 1024 * 1024
    #: Seconds an upstream may stay silent (between bytes) before the attempt fails.
    upstream_timeout_s: float = 300.0
    #: Seconds after which no new attempt (retry or fallback) starts for a request.
    retry_deadline_s: float = 60.0
    #: The environment variable (or systemd credential) holding a Redis URL: state shared by
    #: several replicas. None: SQLite in state_dir.
    redis_url_env: str | None = None
    #: Seconds a target stays out of rotation after a connection error, timeout or 5xx that
    #: named no wait.
    error_cooldown_s: float = 2.0
    #: Seconds a client may take to send its request body (a slow client gets 408).
    body_timeout_s: float = 30.0
    #: Whether the file names state_dir (else it follows $TIERLOCAL_HOME of whoever reads the file).
    state_dir_named: bool = False


#: What each tier is, as usage reports and the dashboard name it.
TIER_NAMES = {1: "your cluster", 2: "local", 3: "hosted API"}


@dataclass(frozen=True)
class Target:
    """One upstream: an OpenAI-compatible base URL, the model id it knows, and where its key
    comes from (None: a local engine without a key). ``declared_tier``: 1 for a cluster of your
    own (``usd_per_hour`` its cost, whether it serves or not), 2 a local engine, 3 a hosted API
    billed per token; None: 3 with a key, else 2."""

    #: The upstream's OpenAI-compatible base URL (http or https), e.g. http://127.0.0.1:8080/v1.
    url: str
    #: The model id this upstream knows (sent upstream in place of the route's).
    model: str
    #: The environment variable holding this upstream's API key (a hosted API).
    api_key_env: str | None = None
    #: The systemd credential holding it, instead (LoadCredential=NAME:FILE).
    api_key_credential: str | None = None
    #: 1 a cluster of your own, 2 a local engine, 3 a hosted API priced per token
    #: (needs a key). Left out: 3 with a key, else 2.
    declared_tier: int | None = None
    #: What a tier-1 cluster costs per hour, whether it serves or not (tier = 1 only).
    usd_per_hour: float | None = None
    #: The protocols it answers natively below ``url``: ``chat_completions`` (with completions and
    #: embeddings), ``messages`` (Anthropic's, at ``url``/messages) and ``responses``. Left out: all
    #: three for a local engine (llama-server and Ollama answer them), ``["chat_completions"]`` for a
    #: hosted API or a cluster. A request in a protocol no target speaks is refused (400).
    declared_speaks: tuple[str, ...] | None = None

    @property
    def speaks(self) -> tuple[str, ...]:
        """The protocol families it answers natively: ``chat_completions`` (with completions and
        embeddings), ``messages`` (Anthropic, at ``url``/messages) and ``responses``. Left out: all
        three for a local engine (llama-server and Ollama answer them), chat completions only
        for a hosted API or a cluster."""
        if self.declared_speaks is not None:
            return self.declared_speaks
        return FAMILIES if self.tier == 2 else ("chat_completions",)

    @property
    def hosted(self) -> bool:
        """It needs a key (a hosted API, or a cluster behind one)."""
        return self.api_key_env is not None or self.api_key_credential is not None

    @property
    def tier(self) -> int:
        """1 your cluster, 2 a local engine, 3 a hosted API (the only tier priced per token)."""
        if self.declared_tier is not None:
            return self.declared_tier
        return 3 if self.hosted else 2

    @property
    def label(self) -> str:
        """How logs, metrics and usage rows name it: the URL and the model, never the key."""
        return f"{self.url}#{self.model}"


@dataclass(frozen=True)
class Route:
    """The id clients send, and the targets tried in order. ``store_bodies``: keep each
    request's and response's first ``max_stored_body_bytes`` (redacted) with its usage row."""

    #: The model id clients send (unique across routes; no control characters).
    model: str
    #: The upstreams to try, in order: 1 to 16 targets (below).
    targets: tuple[Target, ...]
    #: Keep each request's and response's first bytes (redacted) with its usage row.
    store_bodies: bool = False
    #: How many bytes of each body to keep when store_bodies is on (at most 1 MiB).
    max_stored_body_bytes: int = 16384
    #: Each user's decode floor (tokens/s): a local target whose speed with this request added to
    #: those in flight — as its `tierlocal serve` planned it, or `bench --users` measured it —
    #: is below it is passed over for the next target (counted as below_speed_floor).
    min_user_tokens_per_s: float | None = None
    #: The longest wait for the first token (seconds) a local target may be predicted to give
    #: at its load with this request; past it, the next target (first_token_over_limit).
    max_first_token_s: float | None = None


@dataclass(frozen=True)
class GatewayConfig:
    server: ServerConfig
    routes: tuple[Route, ...]
    prices: dict[str, ApiPrices]
    users: tuple[User, ...]
    source: str
    #: The file it was read from (None: the built-in configuration).
    path: Path | None = None

    @cached_property
    def _routes_by_model(self) -> dict[str, Route]:
        return {route.model: route for route in self.routes}

    @cached_property
    def _users_by_name(self) -> dict[str, User]:
        return {user.name: user for user in self.users}

    def route(self, model: str) -> Route | None:
        return self._routes_by_model.get(model)

    def user(self, name: str) -> User | None:
        return self._users_by_name.get(name)

    def is_admin(self, name: str) -> bool:
        """Whether ``name`` sees everyone's spend: ``admin = true`` in its [[users]] entry, or
        "local" — the operator's key the gateway makes on loopback — when no entry names it."""
        user = self.user(name)
        return user.admin if user is not None else name == "local"


def _target(raw: object, source: str, where: str) -> Target:
    table = as_table(raw, source, where)
    if "api_key" in table:
        raise config_error(
            source,
            f"{where}.api_key",
            "keys never go in the config file",
            "name the environment variable with api_key_env (or a systemd credential with api_key_credential)",
        )
    unknown = set(table) - TARGET_KEYS
    if unknown:
        raise config_error(
            source,
            where,
            f"unknown key {sorted(unknown)[0]!r}",
            "a target has url, model, and optionally api_key_env or api_key_credential, tier, usd_per_hour and speaks",
        )
    url, model = table.get("url"), table.get("model")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise config_error(source, f"{where}.url", f"{url!r} is not an http(s) URL", 'e.g. "http://127.0.0.1:8080/v1"')
    if not isinstance(model, str) or not model:
        raise config_error(source, f"{where}.model", "is missing", "the model id this upstream knows")
    key_env, credential = table.get("api_key_env"), table.get("api_key_credential")
    for name, value in (("api_key_env", key_env), ("api_key_credential", credential)):
        if value is not None and (not isinstance(value, str) or not value):
            raise config_error(source, f"{where}.{name}", "must be a non-empty name", "e.g. MOONSHOT_API_KEY")
    tier, usd_per_hour = _tier(table, source, where)
    keyless_remote = (
        urlsplit(url).scheme == "https" and urlsplit(url).hostname not in ("localhost", "127.0.0.1") and key_env is None and credential is None
    )
    if keyless_remote and tier != 1:
        raise config_error(source, where, f"the hosted target {url} has no key", 'add api_key_env = "…" naming the variable that holds it')
    speaks = _speaks(table.get("speaks"), source, f"{where}.speaks")
    return Target(url.rstrip("/"), model, key_env, credential, tier, usd_per_hour, speaks)  # type: ignore[arg-type]


def _speaks(value: object, source: str, where: str) -> tuple[str, ...] | None:
    """A target's ``speaks``: a non-empty list of protocol families (None when not given)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or any(item not in FAMILIES for item in value):
        raise config_error(source, where, f"{value!r} is not a list of protocols", f"list some of: {', '.join(FAMILIES)}")
    return tuple(dict.fromkeys(value))


def _tier(table: dict[str, object], source: str, where: str) -> tuple[int | None, float | None]:
    """A target's ``tier`` (1, 2 or 3; None when not given) and ``usd_per_hour`` (tier 1 only)."""
    tier = table.get("tier")
    if tier is not None and (isinstance(tier, bool) or tier not in TIER_NAMES):
        raise config_error(
            source, f"{where}.tier", f"{tier!r} is not a tier", "1 your own cluster, 2 a local engine, 3 a hosted API priced per token"
        )
    if tier == 3 and table.get("api_key_env") is None and table.get("api_key_credential") is None:
        raise config_error(source, f"{where}.tier", "a hosted API (tier 3) needs a key", 'add api_key_env = "…" naming the variable that holds it')
    usd_per_hour = positive_number(table.get("usd_per_hour"), source, f"{where}.usd_per_hour")
    if usd_per_hour is not None and tier != 1:
        raise config_error(
            source, f"{where}.usd_per_hour", "only a cluster of your own (tier = 1) has a cost per hour", "add tier = 1, or leave usd_per_hour out"
        )
    return tier, usd_per_hour


def _prices(raw: object, source: str) -> dict[str, ApiPrices]:
    prices = {api.model: api.prices for api in load_apis()}  # dated defaults from recipes/apis.toml
    for model, entry in as_table(raw, source, "prices").items():
        table = as_table(entry, source, f"prices.{model}")
        if unknown := set(table) - PRICE_KEYS:
            raise config_error(source, f"prices.{model}.{sorted(unknown)[0]}", "unknown key", f"[prices.MODEL] has: {', '.join(sorted(PRICE_KEYS))}")
        try:
            prices[model] = ApiPrices(float(table["input_cache_hit"]), float(table["input_cache_miss"]), float(table["output"]))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            raise config_error(
                source, f"prices.{model}", "needs input_cache_hit, input_cache_miss and output (USD per million tokens)", f"see {CONFIG_DOCS}"
            ) from None
    return prices


def parse_config(data: dict[str, object], source: str) -> GatewayConfig:
    """Validate a parsed TOML document.

    Raises:
        UsageError: an unknown section or key, or a value that is not what it must be (the
            message names the file and the key).
    """
    unknown = set(data) - {"server", "routes", "prices", "users"}
    if unknown:
        raise config_error(source, sorted(unknown)[0], "unknown section", "the sections are [server], [[routes]], [prices.MODEL] and [[users]]")
    server = _server(data, source)
    raw_routes = data.get("routes", [])
    if not isinstance(raw_routes, list) or len(raw_routes) > MAX_ROUTES:
        raise config_error(source, "routes", f"must be a list of at most {MAX_ROUTES} [[routes]]", f"see {CONFIG_DOCS}")
    routes: list[Route] = []
    for index, raw in enumerate(raw_routes):
        routes.append(_route(raw, source, f"routes[{index}]", routes))
    raw_users = data.get("users", [])
    if not isinstance(raw_users, list) or len(raw_users) > MAX_USERS:
        raise config_error(source, "users", f"must be a list of at most {MAX_USERS} [[users]]", f"see {CONFIG_DOCS}")
    users = [parse_user(raw, source, f"users[{index}]") for index, raw in enumerate(raw_users)]
    if len({user.name for user in users}) != len(users):
        raise config_error(source, "users", "a name appears twice", "each [[users]] name must be unique")
    return GatewayConfig(server, tuple(routes), _prices(data.get("prices", {}), source), tuple(users), source)


def _server(data: dict[str, object], source: str) -> ServerConfig:
    """The [server] table, with the defaults for what it leaves out."""
    server_table = as_table(data.get("server", {}), source, "server")
    port = server_table.get("port", constants.GATEWAY_PORT)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise config_error(source, "server.port", f"{port!r} is not a port", "1 to 65535")
    unknown = set(server_table) - SERVER_KEYS
    if unknown:
        raise config_error(source, f"server.{sorted(unknown)[0]}", "unknown key", f"[server] has: {', '.join(sorted(SERVER_KEYS))}")
    defaults = ServerConfig()
    state_dir = server_table.get("state_dir", str(defaults.state_dir))
    tls_cert, tls_key = server_table.get("tls_cert"), server_table.get("tls_key")
    if (tls_cert is None) != (tls_key is None):
        raise config_error(source, "server", "tls_cert and tls_key go together", "give both PEM files, or neither (and put a TLS proxy in front)")
    return ServerConfig(
        str(server_table.get("host", constants.DEFAULT_HOST)),
        port,
        Path(str(state_dir)),
        None if tls_cert is None else Path(str(tls_cert)),
        None if tls_key is None else Path(str(tls_key)),
        positive_int(server_table.get("default_max_tokens"), source, "server.default_max_tokens") or defaults.default_max_tokens,
        positive_int(server_table.get("max_body_bytes"), source, "server.max_body_bytes") or defaults.max_body_bytes,
        positive_number(server_table.get("upstream_timeout_s"), source, "server.upstream_timeout_s") or defaults.upstream_timeout_s,
        positive_number(server_table.get("retry_deadline_s"), source, "server.retry_deadline_s") or defaults.retry_deadline_s,
        variable_name(server_table.get("redis_url_env"), source, "server.redis_url_env"),
        positive_number(server_table.get("error_cooldown_s"), source, "server.error_cooldown_s") or defaults.error_cooldown_s,
        positive_number(server_table.get("body_timeout_s"), source, "server.body_timeout_s") or defaults.body_timeout_s,
        "state_dir" in server_table,
    )


def _route(raw: object, source: str, where: str, earlier: list[Route]) -> Route:
    """One [[routes]] entry (its model not routed by an ``earlier`` one)."""
    table = as_table(raw, source, where)
    model, targets = table.get("model"), table.get("targets")
    if not isinstance(model, str) or not model:
        raise config_error(source, f"{where}.model", "is missing", "the model id clients send")
    if problem := name_problem(model):
        raise config_error(source, f"{where}.model", problem, "use the model id clients send")
    if any(route.model == model for route in earlier):
        raise config_error(source, f"{where}.model", f"{model!r} is routed twice", "merge the targets into one [[routes]]")
    if not isinstance(targets, list) or not 1 <= len(targets) <= MAX_TARGETS:
        raise config_error(
            source,
            f"{where}.targets",
            f"must list 1 to {MAX_TARGETS} targets",
            'e.g. targets = [ { url = "http://127.0.0.1:8080/v1", model = "qwen3-14b" } ]',
        )
    unknown = set(table) - ROUTE_KEYS
    if unknown:
        raise config_error(
            source,
            f"{where}.{sorted(unknown)[0]}",
            "unknown key",
            "a route has model, targets, and optionally store_bodies, max_stored_body_bytes, min_user_tokens_per_s and max_first_token_s",
        )
    store_bodies = table.get("store_bodies", False)
    if not isinstance(store_bodies, bool):
        raise config_error(source, f"{where}.store_bodies", f"must be true or false, not {store_bodies!r}", "bodies are not stored unless it is true")
    cap = positive_int(table.get("max_stored_body_bytes"), source, f"{where}.max_stored_body_bytes") or Route.max_stored_body_bytes
    return Route(
        model,
        tuple(_target(target, source, f"{where}.targets[{i}]") for i, target in enumerate(targets)),
        store_bodies,
        min(cap, 1 << 20),
        positive_number(table.get("min_user_tokens_per_s"), source, f"{where}.min_user_tokens_per_s"),
        positive_number(table.get("max_first_token_s"), source, f"{where}.max_first_token_s"),
    )


def load_config(path: Path) -> GatewayConfig:
    """Read and validate the gateway's TOML file."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})", hint="give the gateway's TOML file with --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}", hint=f"fix the syntax (see {CONFIG_DOCS})") from None
    return replace(parse_config(data, str(path)), path=path)


def default_config() -> GatewayConfig:
    """Without --config: every hosted API in recipes/apis.toml (Kimi K3 → Moonshot, key from
    MOONSHOT_API_KEY), on loopback, state in tierlocal's data directory. Local engines are
    added by the server when it finds them."""
    routes = tuple(
        Route(api.model, (Target(api.base_url.rstrip("/"), api.model_id, api.key_env, declared_speaks=api.speaks),)) for api in load_apis()
    )
    return GatewayConfig(ServerConfig(), routes, {api.model: api.prices for api in load_apis()}, (), "(built-in default)")
