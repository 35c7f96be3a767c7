# The image the deploy manifests name (examples/deploy: image rlax:latest): this
# repository, installed as the README installs it, plus JAX's accelerator extra.
#
#   docker build -t rlax:latest .                                 # CPU
#   docker build --build-arg ACCELERATOR=cuda -t rlax:latest .    # NVIDIA GPUs (CUDA 12 wheels)
#   docker build --build-arg ACCELERATOR=tpu -t rlax:latest .     # Cloud TPU (libtpu)
#
# CUDA comes as pip wheels (jax[cuda12]); the host needs only the NVIDIA driver and
# container toolkit. tests/test_dockerfile.py checks the install against the README's.
ARG PYTHON=3.11
FROM python:${PYTHON}-slim

ARG ACCELERATOR=cpu
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

# The README's set-up: a venv, then pip install -e . (with the extra) at the repository root.
WORKDIR /opt/rlax
RUN python -m venv /opt/rlax/.venv
ENV PATH=/opt/rlax/.venv/bin:$PATH VIRTUAL_ENV=/opt/rlax/.venv
COPY . /opt/rlax
RUN case "$ACCELERATOR" in \
      cpu) extra="" ;; \
      cuda|tpu) extra="[$ACCELERATOR]" ;; \
      *) echo "ACCELERATOR: cpu, cuda or tpu, got '$ACCELERATOR'" >&2; exit 2 ;; \
    esac \
    && pip install -e ".$extra"

CMD ["rlax", "run", "--gin", "quickstart"]
