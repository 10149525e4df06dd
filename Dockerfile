# raylm's image for KubeRay (rayjob.yaml) or any cluster that runs containers: Ray's own GPU image, pinned to the
# Ray that pyproject.toml and CI install, with this checkout installed by the README's GPU install line.
#   docker build -t raylm:0.1.0-ray2.60.0-py311-gpu .
# The packages that move raylm's numbers are pinned to the versions CI runs the suite on, so that an image built
# later scores as the tested one did: torch (the README's and .ci/run's pin; from PyPI, its CUDA build),
# transformers, lm-eval (pyproject.toml's pin) and Ray (the image's own, named so pip keeps it).
# tests/test_rayjob.py checks the FROM line's Ray against rayjob.yaml, cluster.yaml and the Ray installed here, the
# pins against the README, .ci/run, pyproject.toml and the versions installed here, and the RUN line against the
# README (no docker build runs in the tests).
FROM rayproject/ray:2.60.0-py311-gpu
WORKDIR /home/ray/raylm
COPY --chown=ray:users . .
RUN pip install "torch==2.13.0" "transformers==5.25.0" "lm-eval==0.4.13" "ray[default]==2.60.0" -e ".[tasks]"
