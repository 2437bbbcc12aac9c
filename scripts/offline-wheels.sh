#!/usr/bin/env bash
# Fetches, as wheels, what a GPU node without network needs to run the whole service (`scalebench up`: API,
# worker, scheduler on the embedded SQLite + filesystem broker) and the three engines' programs, when the node has
# python 3.12 with torch, numpy, matplotlib, httpx, click, rich and typer but none of the server packages. It
# runs scripts/peer-wheels.sh (torchao, pydantic, TorchTitan 0.2.2) and adds the server's packages, pinned to the
# versions the tests run with. Nothing is installed here.
#
#   bash scripts/offline-wheels.sh [DEST]       # DEST defaults to .whl in the repository root (git-ignored)
#
# Then, on the GPU node, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site DEST/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
top=$(git rev-parse --show-toplevel)
dest=${1:-$top/.whl}
bash "$top/scripts/peer-wheels.sh" "$dest" >/dev/null
plat=()
for n in 17 24 27 28 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
server=(fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 uvicorn==0.55.0 sqlalchemy==2.1.9 greenlet==3.5.6
        alembic==1.20.1 mako==1.4.3 celery==5.7.0 kombu==5.7.0 billiard==4.3.2 vine==5.1.0 amqp==5.4.2
        click-didyoumean==0.3.1 click-plugins==1.1.1.2 click-repl==0.4.1 prompt-toolkit==3.0.53 wcwidth==0.9.4
        redis==8.1.0 tzdata psycopg==3.3.9 tzlocal==5.4.5 opentelemetry-api==1.45.2 python-dateutil==2.9.0.post0
        typing-extensions==4.16.0 click==8.5.1)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$dest" "${server[@]}"
dups=$(ls "$dest" | sed -E 's/-[0-9][^-]*-.*\.whl$//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then echo "more than one wheel of: $dups (clear $dest and fetch again)" >&2; exit 1; fi
ls "$dest"
du -sh "$dest"
