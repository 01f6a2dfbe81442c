# meshfl agent: torch (CPU) + paho-mqtt, no FastAPI. Build from the repository root:
#   docker build -f docker/agent.Dockerfile -t meshfl-agent .
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
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && pip install --no-cache-dir ".[agent]" \
 && useradd --create-home --uid 10001 meshfl
USER 10001
WORKDIR /home/meshfl
ENTRYPOINT ["meshfl", "agent", "run"]
