# forward_bench, three sides, order balanced over 6 rounds (each side twice in each position):
#   bash run3.sh OUT [FIRST_ROUND]   (appends to OUT/raw.jsonl; FIRST_ROUND numbers a second set)
O=${1:-/tmp/fwd3}; R0=${2:-0}; mkdir -p $O
orders=("before head final" "final head before" "head final before" "before final head" "final before head" "head before final")
for r in 0 1 2 3 4 5; do for side in ${orders[$r]}; do
  pkg=$side; [ $side = head ] && pkg=head2
  PYTHONPATH=/tmp/fwd-pkg-$pkg python forward_bench.py $side | sed "s/^{/{\"round\": $((R0 + r)), \"position\": \"$(echo ${orders[$r]} | tr ' ' '\n' | grep -n "^$side$" | cut -d: -f1)\", /" >> $O/raw.jsonl 2>>$O/stderr.log
done; done
echo finished >> $O/stderr.log
