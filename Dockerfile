# One image for the runner, the HTTP API and the MCP server (scripts/image.sh builds it).
#
# The base is made without a registry: Debian bookworm minbase with Python 3.11,
# debootstrapped and `docker import`ed (scripts/image.sh). The wheels are built on the
# host into build/wheelhouse and installed here offline: the build needs no network.
# psycopg's binary wheel brings its own libpq (the base has none).
#
#   docker run IMAGE serve --host 0.0.0.0 --port 8080 --token-file /run/secrets/token
#   docker run IMAGE mcp
#   docker run --entrypoint /opt/scratchbank/bin/python IMAGE -m scratchbank.adapters.runner_process
ARG BASE=scratchbank-python:bookworm

FROM ${BASE} AS build
COPY build/wheelhouse /wheels
RUN python3 -m venv /opt/scratchbank \
    && /opt/scratchbank/bin/pip install --no-cache-dir --no-index --find-links /wheels \
        "scratchbank[all]" "psycopg[binary]" \
    && /opt/scratchbank/bin/pip uninstall -y -q pip \
    && find /opt/scratchbank -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
COPY --from=build /opt/scratchbank /opt/scratchbank
# Non-root, no home to write: every state lives behind the URLs of the settings.
USER 10001:10001
ENV PATH=/opt/scratchbank/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
ENTRYPOINT ["/opt/scratchbank/bin/scratchbank"]
CMD ["--help"]
