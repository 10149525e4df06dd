# raylm's image for KubeRay (rayjob.yaml) or any cluster that runs containers: Ray's own GPU image, pinned to the
# Ray that pyproject.toml and CI install, with this checkout installed by the README's GPU install line.
#   docker build -t raylm:0.1.0-ray2.60.0-py311-gpu .
# tests/test_rayjob.py checks the FROM line's Ray against rayjob.yaml, cluster.yaml and the Ray installed here, and
# the RUN line against the README (no docker build runs in the tests).
FROM rayproject/ray:2.60.0-py311-gpu
WORKDIR /home/ray/raylm
COPY --chown=ray:users . .
# pip keeps the image's Ray (pyproject.toml accepts it) and adds torch, transformers and lm-eval for [tasks].
RUN pip install -e ".[tasks]"
