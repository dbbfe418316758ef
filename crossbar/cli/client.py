"""crossbar's admin API as `crossbar ctl` calls it: plain blocking HTTP (a short-lived
process), every failure one CtlError line for the operator."""

from __future__ import annotations

import json
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlencode
from urllib.request import Request, urlopen

DEFAULT_ADMIN = "http://127.0.0.1:8081"


class CtlError(Exception):
    """What went wrong, in one line for the operator (more lines for a refused reload)."""


class AdminClient:
    """Calls crossbar's admin API at `base` with an optional bearer `token`."""

    def __init__(self, base: str, token: str = "", timeout: float = 30.0) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        """The JSON answer of one request; CtlError when it fails."""
        params = {k: v for k, v in query.items() if v is not None}
        url = self.base + path + (f"?{urlencode(params)}" if params else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = Request(url, data=data, headers=headers, method=method)
        try:
            with urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except HTTPError as e:
            raise CtlError(_explain(e)) from None
        except URLError as e:
            raise CtlError(f"{self._unreachable}: {e.reason}") from None
        except (TimeoutError, ConnectionError) as e:
            raise CtlError(f"{self._unreachable}: {e}") from None
        except ValueError:
            raise CtlError(f"{url} did not answer JSON; is it crossbar's admin port?") from None

    @property
    def _unreachable(self) -> str:
        return f"cannot reach crossbar's admin API at {self.base}"


def _explain(e: HTTPError) -> str:
    try:
        error = json.loads(e.read())["error"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {e.code} from {e.url}"
    lines = error.get("errors")
    if lines:  # a refused reload: every problem on its own line
        return f"{e.code}: config refused; the old config stays:\n" + "\n".join(
            f"  {line}" for line in lines
        )
    return f"{e.code}: {error.get('message', '')}"


def seg(name: str) -> str:
    """A name as one segment of an admin API path."""
    return quote(name, safe="")
