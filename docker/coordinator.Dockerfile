# meshfl coordinator: FastAPI + SQLAlchemy, no torch. Build from the repository root:
#   docker build -f docker/coordinator.Dockerfile -t meshfl-coordinator .
FROM python:3.11-slim
WORKDIR /opt/meshfl
COPY pyproject.toml README.md ./
COPY meshfl ./meshfl
COPY edge_agent ./edge_agent
COPY models ./models
COPY coordinator ./coordinator
COPY broker ./broker
# The project itself is installed from the copied source, pinned by this checkout.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[coordinator,postgres]" \
 && useradd --create-home --uid 10001 meshfl
USER 10001
WORKDIR /home/meshfl
EXPOSE 8080
# /healthz over HTTPS when MESHFL_COORDINATOR_TLS_CERT is set (loopback: not verified).
HEALTHCHECK CMD ["python", "-c", "import os, ssl, urllib.request as u; s = 'https' if os.environ.get('MESHFL_COORDINATOR_TLS_CERT') else 'http'; u.urlopen(s + '://127.0.0.1:8080/healthz', context=ssl._create_unverified_context())"]
ENTRYPOINT ["meshfl", "coordinator", "serve", "--host", "0.0.0.0", "--port", "8080"]
