"""`scalebench plot ID -o curves.png`: the experiment's scaling curves as a PNG (GET /experiments/{id}/scaling.png:
throughput with the ideal line, efficiency and fp8 speedup against N). Registered by cli/main.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from cli.client import ApiClient, CliError
from cli.runs import ServerOpt, TokenOpt, cli_errors, console

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fetch_png(
    client: ApiClient, experiment_id: int, baseline_num_devices: int | None = None, full_size: int | None = None
) -> bytes:
    params = {
        k: v for k, v in {"baseline_num_devices": baseline_num_devices, "full_size": full_size}.items() if v is not None
    }
    response = client.request("GET", f"/experiments/{experiment_id}/scaling.png", params=params)
    if not response.content.startswith(PNG_MAGIC):
        raise CliError(f"the API answered {response.headers.get('content-type')!r}, not a PNG")
    return response.content


def output_path(raw: str, experiment_id: int) -> Path:
    """-o's PNG file. A directory gets experiment-ID-curves.png inside it: one that exists, or any path that ends in
    a separator (`-o newdir/`), which is made when missing (pathlib drops a trailing separator, so -o stays a
    string until here)."""
    path = Path(raw)
    separators = tuple(s for s in (os.sep, os.altsep) if s)
    if raw.endswith(separators) or path.is_dir():
        return path / f"experiment-{experiment_id}-curves.png"
    return path


def register(app: typer.Typer) -> None:
    @app.command("plot")
    @cli_errors
    def plot(
        experiment_id: Annotated[int, typer.Argument(help="Experiment id.")],
        output: Annotated[
            str,
            typer.Option(
                "-o",
                "--output",
                help="PNG file; a directory (or a path ending in '/', created): experiment-ID-curves.png in it.",
            ),
        ] = "curves.png",
        baseline_num_devices: Annotated[
            int | None, typer.Option(help="N0 of the efficiency (default: each series' smallest measured N).")
        ] = None,
        full_size: Annotated[
            int | None, typer.Option(help="N the fits predict at (default: the cluster's size).")
        ] = None,
        server: ServerOpt = None,
        token: TokenOpt = None,
    ) -> None:
        """Write the scaling curves (throughput with ideal line, efficiency, fp8 speedup vs N) to a PNG."""
        path = output_path(output, experiment_id)
        with ApiClient(server, token, timeout_s=60) as client:
            png = fetch_png(client, experiment_id, baseline_num_devices, full_size)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)
        except OSError as exc:
            raise CliError(f"-o/--output {str(path)!r}: cannot write the PNG there: {exc}") from None
        console.print(f"wrote {path} ({len(png) / 1024:.0f} KiB)", highlight=False)
