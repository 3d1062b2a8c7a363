"""`infer ps`: what a running `infer serve` has loaded (its /api/ps), as `ollama ps` shows it."""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Optional

import typer

from .app import app
from .sizes import format_size


@app.command(help="Show the models a running `infer serve` has loaded: size, context, when each is unloaded.")
def ps(
    host: str = typer.Option("127.0.0.1", "--host", help="The server's address."),
    port: int = typer.Option(8080, "--port", help="The server's port."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="INFER_API_KEY", show_default=False,
                                          help="The server's API key, if it has one."),
    as_json: bool = typer.Option(False, "--json", help="Print the server's answer as it is."),
) -> None:
    url = f"http://{host}:{port}/api/ps"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            data = json.load(r)
    except urllib.error.HTTPError as e:
        sys.stderr.write(f"error: {url} answered {e.code}{' (wrong or missing --api-key)' if e.code == 401 else ''}\n")
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        sys.stderr.write(f"error: no infer server at http://{host}:{port} ({reason}); start one with infer serve\n")
        raise typer.Exit(1) from None
    models = data.get("models", []) if isinstance(data, dict) else []
    if as_json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    rows = [("NAME", "SIZE", "CONTEXT", "UNTIL")] + [
        (str(m.get("name", "")), format_size(int(m.get("size", 0))), str(m.get("context_length", "")),
         _until(str(m.get("expires_at", "")))) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _until(iso: str) -> str:
    """'4 minutes from now', 'Forever' (a year or more away), as ollama ps says it."""
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    s = (t - datetime.now(timezone.utc)).total_seconds()
    if s > 365 * 86400:
        return "Forever"
    if s < 1:
        return "now"
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if s >= n:
            k = int(s // n)
            return f"{k} {unit}{'s' if k != 1 else ''} from now"
    return "now"
