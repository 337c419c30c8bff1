# One image for the operator (`specfleet run`) and the router (`specfleet-router`); the operator
# points the routers it creates at this same image.
# The full (not slim) image builds: it has gcc and Python's headers for mypyc.
FROM python:3.11.11-bookworm AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY operator/ operator/
COPY runtime/ runtime/
COPY testbed/ testbed/
COPY scripts/compile-router.sh scripts/
# Dependencies from pyproject.toml, pinned by constraints.txt (all wheels).
RUN python -m venv /opt/specfleet \
    && /opt/specfleet/bin/pip install --no-cache-dir -c constraints.txt .
# The router's request path compiled with mypyc, as `make test-router-native` tests it: built in a
# throw-away venv that also has mypy, then only the C extensions are copied into the shipped one.
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir -c constraints.txt . "mypy==$(sed -n 's/^mypy==//p' constraints.txt)" \
    && bash scripts/compile-router.sh --python /opt/build/bin/python --out /tmp/native \
    && site=/opt/specfleet/lib/python3.11/site-packages \
    && cp /tmp/native/*__mypyc.*.so "$site"/ \
    && cp /tmp/native/specfleet_runtime/router/*.so "$site"/specfleet_runtime/router/ \
    && /opt/specfleet/bin/python -c "from specfleet_runtime.router.build import router_build as b; assert b() == 'compiled', b()"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="specfleet" \
      org.opencontainers.image.description="Operator and router for speculative-decoding vLLM fleets"
COPY --from=build /opt/specfleet /opt/specfleet
ENV PATH=/opt/specfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root, matching the chart's runAsUser.
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT []
CMD ["specfleet", "run"]
