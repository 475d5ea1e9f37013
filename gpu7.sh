source .gpu-deps/prep.sh
for L in 0 1; do
  echo "== ACTIVATION_LOOP=$L tests"
  COOPMAT_CACHE_DIR=/tmp/cl$L timeout 200 python actloop.py $L pytest tests/test_epilogue.py -q -p no:cacheprovider -k "nv2" 2>&1 | tail -3
done > $OUT/t.txt 2>&1
for L in 0 1 0 1; do
  echo "== ACTIVATION_LOOP=$L cost"
  COOPMAT_CACHE_DIR=/tmp/cl$L timeout 150 python actloop.py $L epi 4096 --family=nv2 2>&1 | grep -v "^ " | cut -c1-60
done >> $OUT/t.txt 2>&1
cat $OUT/t.txt
