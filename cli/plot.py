"""`scalebench plot ID -o curves.png`: the experiment's scaling curves as a PNG (GET /experiments/{id}/scaling.png:
throughput with the ideal line, efficiency and fp8 speedup against N). Registered by cli/main.py."""

from __future__ import annotations

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


def register(app: typer.Typer) -> None:
    @app.command("plot")
    @cli_errors
    def plot(
        experiment_id: Annotated[int, typer.Argument(help="Experiment id.")],
        output: Annotated[
            Path, typer.Option("-o", "--output", help="PNG file (a directory: experiment-ID-curves.png in it).")
        ] = Path("curves.png"),
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
        if output.is_dir():
            output = output / f"experiment-{experiment_id}-curves.png"
        with ApiClient(server, token, timeout_s=60) as client:
            png = fetch_png(client, experiment_id, baseline_num_devices, full_size)
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_bytes(png)
        except OSError as exc:
            raise CliError(f"-o/--output {str(output)!r}: cannot write the PNG there: {exc}") from None
        console.print(f"wrote {output} ({len(png) / 1024:.0f} KiB)", highlight=False)
