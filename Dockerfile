# raylm's image for KubeRay (rayjob.yaml) or any cluster that runs containers: Ray's own GPU image, pinned to the
# Ray that pyproject.toml installs, with this checkout installed with every extra a flag needs: [tasks] (every
# lm-eval task, IFEval's and MATH's dependencies included), [peft] (--peft) and [wandb] (--wandb_args).
#   docker build -t raylm:0.1.0-ray2.60.0-py311-gpu .
# The packages that move raylm's numbers are pinned to the versions the suite is run on, so that an image built
# later scores as the tested one did: torch (the README's pin; from PyPI, its CUDA build), transformers, lm-eval
# (pyproject.toml's pin) and Ray (the image's own, named so pip keeps it).
FROM rayproject/ray:2.60.0-py311-gpu
# Code-execution tasks (HumanEval, MBPP) run each generated program in a bubblewrap sandbox (docs/sandbox.md).
RUN sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends bubblewrap \
    && sudo rm -rf /var/lib/apt/lists/*
WORKDIR /home/ray/raylm
COPY --chown=ray:users . .
RUN pip install "torch==2.13.0" "transformers==5.25.0" "lm-eval==0.4.13" "ray[default]==2.60.0" -e ".[tasks,peft,wandb]"
# IFEval's code looks for nltk's punkt_tab tokenizer when it is imported and downloads it where it is missing, which
# fails on a node without internet: the image brings it, and NLTK_DATA tells nltk where it is.
ENV NLTK_DATA=/home/ray/nltk_data
RUN python -c "import nltk; nltk.download('punkt_tab', download_dir='/home/ray/nltk_data', raise_on_error=True); nltk.data.find('tokenizers/punkt_tab')"
