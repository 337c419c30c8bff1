# One image for the operator (`specfleet run`) and the router (`specfleet-router`); the operator
# points the routers it creates at this same image.
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY operator/ operator/
COPY runtime/ runtime/
COPY testbed/ testbed/
# Dependencies from pyproject.toml, pinned by constraints.txt; no compilers needed (all wheels).
RUN python -m venv /opt/specfleet \
    && /opt/specfleet/bin/pip install --no-cache-dir -c constraints.txt .

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
