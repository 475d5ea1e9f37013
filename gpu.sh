source .gpu-deps/prep.sh
for i in 1 2; do
  COOPMAT_CACHE_DIR=/tmp/cc_new python probe_mid.py new 2>&1
  (cd old_head && COOPMAT_CACHE_DIR=/tmp/cc_old python probe_mid.py old 2>&1)
done
COOPMAT_CACHE_DIR=/tmp/cc_new python ab_small.py new 2>&1
(cd old_head && COOPMAT_CACHE_DIR=/tmp/cc_old python ab_small.py old 2>&1)
