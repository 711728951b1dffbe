# PostgreSQL for the device machine, which has none and no network (the workers benchmark there).
#
#   bash benchmarks/pg_carry.sh pack          # here: .pg/pg15.tar.xz (~20 MB) from this Debian's postgresql
#   source benchmarks/pg_carry.sh unpack      # there (root), with .pg in the device call's carry
#
# pack: the server's binaries (postgres, initdb, pg_ctl, pg_isready), the modules initdb loads and
# the share files, laid out as Debian installs them (the server finds its share directory relative
# to its binary), plus every shared library they link that is not glibc's. unpack: the tree into
# /usr (new directories only), and into /tmp/pglibs only those libraries the host lacks by soname
# (ICU, LDAP of Debian's versions), on LD_LIBRARY_PATH; a `postgres` user to run the server as,
# since PostgreSQL refuses root (tests/pg_cluster.py).
case "${1:-}" in
pack)
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
    grep -qx '/.pg/' .git/info/exclude 2>/dev/null || echo /.pg/ >> .git/info/exclude
    ls -la .pg
    ;;
unpack)
    x=$(mktemp -d)
    tar -C "$x" -xJf .pg/pg*.tar.xz
    cp -an "$x"/usr/. /usr/
    mkdir -p /tmp/pglibs
    for l in "$x"/libs/*; do ldconfig -p | grep -q "[[:space:]]$(basename "$l") " || cp "$l" /tmp/pglibs/; done
    export LD_LIBRARY_PATH="/tmp/pglibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    id postgres >/dev/null 2>&1 || useradd -r -M postgres
    echo "pg_carry: $(ls /usr/lib/postgresql/*/bin/postgres) with $(ls /tmp/pglibs | wc -l) carried libraries"
    ;;
*)
    echo "usage: bash benchmarks/pg_carry.sh pack | source benchmarks/pg_carry.sh unpack" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
