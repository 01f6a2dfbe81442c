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
HEALTHCHECK CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz')"]
ENTRYPOINT ["meshfl", "coordinator", "serve", "--host", "0.0.0.0", "--port", "8080"]
