# on the device: before (45c0291, carried in .probe/fwd/before) and after (the working tree), alternating
R=${1:-6}; O=$OUT/fwd; mkdir -p $O
for side in before after; do
  pkg=/tmp/fwd-pkg-$side; rm -rf $pkg; mkdir -p $pkg
  if [ $side = before ]; then src=$PWD/.probe/fwd/before; else src=$PWD; fi
  cp -r $src/autoao $pkg/; for d in search_space kernels evaluators reports; do ln -s $src/$d $pkg/autoao/$d; done
done
for r in $(seq 1 $R); do for side in before after; do
  PYTHONPATH=/tmp/fwd-pkg-$side:/tmp/site python3 .probe/fwd/forward_bench.py $side cuda >> $O/raw.jsonl 2>>$O/stderr.log
done; done
python3 .probe/fwd/summarize.py $O/raw.jsonl > $O/summary.md; cat $O/summary.md; tail -5 $O/stderr.log
