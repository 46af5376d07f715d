"""Base URLs: what the backends send to, what may be shown or stored of them, and what tells two apart.

A base URL can carry credentials in three places: ``user:password@``, its query (``?token=...``, ``?api-key=...``)
and, worst, its path (``https://gw/key/<key>/v1``, ``https://gw/v1/sk-.../``). None of them may reach a record, a
param, a log, a transcript or the cache (docs/failure-modes.md, "Secrets in URLs"):

* :func:`safe_url` is the URL as it may be shown: no ``user:password@``, every query value ``***`` and every
  path segment that looks like a key ``***`` (:func:`path_secrets`);
* :func:`url_credentials` and :func:`query_secrets` are what the client scrubs from every record;
* :func:`url_identity` is the URL as it tells connections and cached replies apart: a query that selects the
  model (``?deployment=modelA``, ``?api-version=...``) counts, by a digest of its value, while a key in the query
  counts by its name only (a new key keeps the replies paid for with the old one). A key in the path cannot be
  told from a path that selects something, so the cache tells two apart by a digest that lives only inside the
  cache key (:meth:`~.base.Backend.cache_identity`).

A key found in a path is warned about once per process (:class:`~mlflow_ragjudge.core.errors.SecretInURLWarning`):
it belongs in ``api_key=`` or the provider's key variable, sent as a header, not in a URL that servers and
proxies write to their logs.
"""

from __future__ import annotations

import hashlib
import re
import threading
import warnings
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit, urlunsplit

from ...core.errors import SecretInURLWarning

__all__ = ["query_secrets", "url_credentials", "split_base_url", "safe_url", "path_secrets", "secret_query_name",
           "url_identity", "url_digest"]

MASK = "***"

#: a query parameter (or the path segment before a value) whose value is a credential: its name, lower case,
#: ``-`` as ``_``; a name ending in ``_key``, ``_token``, ``_secret`` ... counts too
_SECRET_NAMES = frozenset({
    "key", "keys", "apikey", "api_key", "token", "tokens", "access_token", "id_token", "auth", "authorization",
    "secret", "client_secret", "password", "passwd", "pwd", "pass", "sig", "signature", "credential", "credentials",
    "code", "session", "sessionid", "jwt", "bearer", "x_api_key", "subscription_key", "ocp_apim_subscription_key",
})
#: a path segment after which the next one is a credential (``/key/<key>``, ``/token/<token>``)
_PATH_MARKERS = frozenset({"key", "apikey", "api_key", "token", "access_token", "secret", "password", "sig",
                           "signature", "credential", "credentials"})
_SECRET_ENDINGS = ("_key", "_token", "_secret", "_password", "_sig", "_signature", "apikey")
# a segment that looks like a provider's key: sk-..., sk-ant-..., gsk_..., hf_..., ghp_..., AIza... (with digits)
_KEY_PREFIX = re.compile(r"^(?:sk|pk|rk|gsk|hf|ghp|gho|ghs|github_pat|glpat|xai|r8|pplx|nvapi|AIza)[-_]?"
                         r"(?=[A-Za-z0-9_\-]*\d)[A-Za-z0-9_\-]{16,}$")
# a random-looking run of letters and digits (a hex or base64 key, an Azure key's 32 hex digits)
_BLOB = re.compile(r"^[A-Za-z0-9+/=]{20,}$")

_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def secret_query_name(name: str) -> bool:
    """Whether a query parameter (or path marker) called ``name`` carries a credential."""
    n = name.strip().lower().replace("-", "_")
    return n in _SECRET_NAMES or n.endswith(_SECRET_ENDINGS)


def _looks_random(piece: str) -> bool:
    digits = sum(c.isdigit() for c in piece)
    letters = sum(c.isalpha() for c in piece)
    return bool(_BLOB.match(piece)) and digits >= 3 and letters >= 3


def _secret_segment(segment: str, previous: str) -> bool:
    if not segment or segment == MASK:
        return False
    if previous.lower().replace("-", "_") in _PATH_MARKERS and len(segment) >= 6:  # /key/<key>, /token/<token>
        return True
    if _KEY_PREFIX.match(segment):
        return True
    return any(_looks_random(piece) for piece in re.split(r"[-_.~]", segment))


def path_secrets(url: str | None) -> list[str]:
    """The segments of ``url``'s path that look like a key, as written (percent-encoded or not)."""
    if not url:
        return []
    segments = urlsplit(url).path.split("/")
    out = [seg for prev, seg in zip(["", *segments], segments) if _secret_segment(unquote(seg), unquote(prev))]
    return list(dict.fromkeys(out))


def _masked_path(path: str) -> str:
    segments = path.split("/")
    return "/".join(MASK if _secret_segment(unquote(seg), unquote(prev)) else seg
                    for prev, seg in zip(["", *segments], segments))


def query_secrets(query: dict[str, str]) -> list[str]:
    """A base URL's query values (``?token=...``), as written and percent-encoded, as secrets to scrub: a query can
    carry a key as well as ``user:password@`` can."""
    out: list[str] = []
    for v in query.values():
        if v:
            out += [v, quote(v, safe=""), quote_plus(v)]
    return list(dict.fromkeys(out))


def url_credentials(url: str | None) -> list[str]:
    """The credentials a URL carries (``user:password@``, every query value, every path segment that looks like a
    key), raw and percent-decoded, as secrets to scrub."""
    if not url:
        return []
    parts = urlsplit(url)
    raw = [x for x in (parts.password, parts.username) if x]
    raw += [pair.partition("=")[2] for pair in parts.query.split("&") if pair.partition("=")[2]]
    raw += path_secrets(url)
    return list(dict.fromkeys(raw + [unquote(x) for x in raw]))


def split_base_url(url: str | None) -> tuple[str | None, dict[str, str]]:
    """A base URL without its query (and fragment), and the query's parameters.

    The SDKs join a request's path to the base URL as text, so ``http://host/v1?token=T`` became
    ``http://host/v1?token=Tchat/completions`` (a 404 that echoed the token). The backends give the query to the
    SDK as ``default_query`` instead: every request goes to ``<base>/<path>?token=T``. A key in the path is warned
    about here, once per process (every backend takes its base URL in through this).
    """
    if not url:
        return None, {}
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")).rstrip("/") or None
    _warn_path_secrets(base)
    return base, query


def _warn_path_secrets(url: str | None) -> None:
    if not path_secrets(url):
        return
    shown = str(safe_url(url))
    with _WARNED_LOCK:
        if shown in _WARNED:
            return
        _WARNED.add(shown)
    warnings.warn(
        f"the base URL {shown} holds what looks like a key in its path (shown here as {MASK}). It is masked in every "
        "record, param, log and transcript and kept out of the cache, but servers and proxies log URLs: pass the key "
        "as api_key= or its environment variable (OPENAI_API_KEY, ANTHROPIC_API_KEY), which is sent as a header, and "
        "give the base URL without it.", SecretInURLWarning, stacklevel=4)


def safe_url(url: str | None) -> str | None:
    """A URL fit to record: no credentials, every query value masked and every path segment that looks like a key
    masked (``https://host:port/key/***/v1?token=***``)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    keys = [pair.partition("=")[0] for pair in parts.query.split("&") if pair]
    return urlunsplit((parts.scheme, host, _masked_path(parts.path), "&".join(f"{k}={MASK}" for k in keys), ""))


def url_digest(value: str) -> str:
    """A short digest that tells two values apart without showing either."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def url_identity(url: str | None, query: dict[str, str] | None = None) -> str | None:
    """The base URL (without its query) and its ``query`` as they tell connections and cached replies apart, with no
    secret in it: :func:`safe_url`, and the query sorted, each value a digest (``?deployment=sha256:...``) except a
    credential's (``?api-key=***``: a new key is the same server and model). Without a query it is
    :func:`safe_url`, as it has always been."""
    shown = safe_url(url)
    if not query:
        return shown
    items = [f"{k}={MASK}" if secret_query_name(k) or not v else f"{k}={url_digest(v)}"
             for k, v in sorted(query.items())]
    return f"{shown or ''}?{'&'.join(items)}"
