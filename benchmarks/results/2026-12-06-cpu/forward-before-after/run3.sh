# forward_bench, three sides, order balanced over 6 rounds (each side twice in each position)
O=${1:-/tmp/fwd3}; mkdir -p $O
orders=("before head new" "new head before" "head new before" "before new head" "new before head" "head before new")
for r in 0 1 2 3 4 5; do for side in ${orders[$r]}; do
  PYTHONPATH=/tmp/fwd-pkg-$side python /work/main/.probe/fwd/forward_bench.py $side | sed "s/^{/{\"round\": $r, \"position\": \"$(echo ${orders[$r]} | tr ' ' '\n' | grep -n "^$side$" | cut -d: -f1)\", /" >> $O/raw.jsonl 2>>$O/stderr.log
done; done
echo finished >> $O/stderr.log
