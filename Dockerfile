# streamrank worker image: one image, the command picks the worker kind. It installs the
# runtime dependencies only (no `tools` extra: no embedded broker, Redis binary or plots).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# g++: the default forward runtime (STREAMRANK_SCORING_RUNTIME=compiled) compiles its kernels
# with a C++ compiler when a scoring worker loads a version (docs/model.md).
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
# torch first, pinned to the CPU build (an unpinned torch pulls a multi-GB CUDA build).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY streamrank ./streamrank
COPY streams ./streams
COPY scoring ./scoring
COPY schemas ./schemas
COPY workbench ./workbench
RUN pip install . && useradd --uid 10001 streamrank
USER streamrank
EXPOSE 9464 9465
ENTRYPOINT ["streamrank"]
CMD ["--help"]
