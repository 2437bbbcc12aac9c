# One image for every service. The API, migrate and beat need no torch (RUNNER_EXTRAS=""); GPU workers are
# built with the runner extras against the torch build of their vendor:
#   NVIDIA: --build-arg RUNNER_EXTRAS=runner --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
#   AMD:    --build-arg RUNNER_EXTRAS=runner --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/rocm6.4
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
ARG RUNNER_EXTRAS=""
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.11.0
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY core core
COPY db db
COPY api api
COPY worker worker
COPY runner runner
COPY migrations migrations
COPY examples examples
# torch first, from the vendor's index, so that the runner extra does not pull another build
RUN if [ -n "$RUNNER_EXTRAS" ]; then pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"; fi \
 && pip install ".${RUNNER_EXTRAS:+[$RUNNER_EXTRAS]}"
RUN useradd --create-home --uid 10001 scalebench && mkdir -p /data && chown scalebench /data
USER scalebench
ENV SCALEBENCH_DATA_DIR=/data
EXPOSE 8000
CMD ["uvicorn", "api.app:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000"]
