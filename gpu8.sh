source .gpu-deps/prep.sh
export COOPMAT_CACHE_DIR=/tmp/cc8
( timeout 400 python -m pytest tests/test_epilogue.py -q -p no:cacheprovider -rs -k "nv2 or exact or combinations" 2>&1 | tail -5 ) > $OUT/t.txt
cat $OUT/t.txt
