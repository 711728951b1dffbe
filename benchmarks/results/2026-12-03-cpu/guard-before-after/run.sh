for i in 1 2; do
  (cd /tmp/before && source benchmarks/device_env.sh >/dev/null && python benchmarks/guard_latency.py --repeats 3 --out /tmp/glab2/before-$i) > /tmp/glab2/before-$i.log 2>&1
  (cd /work/main && python benchmarks/guard_latency.py --repeats 3 --out /tmp/glab2/after-$i) > /tmp/glab2/after-$i.log 2>&1
done
