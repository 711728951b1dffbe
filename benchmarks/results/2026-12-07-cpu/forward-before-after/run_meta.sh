# meta_guards, three sides, order balanced: bash run_meta.sh OUT [FIRST_ROUND] (6 rounds a call)
O=${1:-/tmp/fwd3/meta}; R0=${2:-0}; mkdir -p $O
orders=("before head final" "final head before" "head final before" "before final head" "final before head" "head before final")
for r in 0 1 2 3 4 5; do for side in ${orders[$r]}; do
  pkg=$side; [ $side = head ] && pkg=head2
  PYTHONPATH=/tmp/fwd-pkg-$pkg:. python meta_guards.py $side | sed "s/^{/{\"round\": $((R0 + r)), \"position\": \"$(echo ${orders[$r]} | tr ' ' '\n' | grep -n "^$side$" | cut -d: -f1)\", /" >> $O/raw.jsonl 2>>$O/stderr.log
done; done
echo finished >> $O/stderr.log
