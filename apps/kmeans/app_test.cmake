# End-to-end test of cf-kmeans (run by CTest: cmake -DAPP=... -DWORK_DIR=... -P this file).
# The demo writes a planted data set as .npy; the app then clusters it from the file
# and must recover the planted labels (adjusted Rand index 1), write its outputs,
# and answer bad command lines with status 2 and bad inputs with status 1.
include(${CMAKE_CURRENT_LIST_DIR}/../common/app_test_lib.cmake)

run(0 out err --help)
expect_match("${out}" "usage: cf-kmeans" "--help")

# Usage errors: status 2 and a message naming the problem.
run(2 out err --k)
expect_match("${err}" "--k needs a value" "missing value")
run(2 out err --bogus 1)
expect_match("${err}" "unknown option '--bogus'" "unknown option")
run(2 out err --k 0)
expect_match("${err}" "--k must be at least 1" "k = 0")
run(2 out err --input data.bin)
expect_match("${err}" "needs --shape N,D" "raw without a shape")
run(2 out err --metric manhattan)
expect_match("${err}" "--metric must be l2 or cosine" "bad metric")
file(WRITE "${WORK_DIR}/bad.json" "{\"k\": 3, \"clusters\": 4}")
run(2 out err --config bad.json)
expect_match("${err}" "unknown config key 'clusters'" "unknown config key")

# The demo: planted clusters recovered; it saves the data and labels for the next runs.
run(0 out err --demo-n 900 --demo-d 4 --k 3 --seed 1 --save-data data.npy --save-labels labels.npy)
last_line("${out}" s)
string(JSON recovered GET "${s}" recovered_planted_clusters)
if(NOT recovered)
  message(FATAL_ERROR "demo did not recover its planted clusters: ${s}")
endif()

# Cluster the saved file: ARI 1 against the saved labels, outputs written.
run(0 out err --input data.npy --labels labels.npy --k 3 --centroids c.npy --assignments a.npy)
last_line("${out}" s)
string(JSON ari GET "${s}" adjusted_rand_index)
string(JSON n GET "${s}" n)
string(JSON iterations GET "${s}" iterations)
if(NOT ari EQUAL 1 OR NOT n EQUAL 900 OR iterations LESS 1)
  message(FATAL_ERROR "clustering data.npy: ${s}")
endif()
expect_match("${out}" "\"event\":\"iteration\",\"iteration\":1," "iteration lines")
# .npy sizes: a 128-byte header, then (3, 4) float32 and (900,) int64.
file(SIZE "${WORK_DIR}/c.npy" c_size)
file(SIZE "${WORK_DIR}/a.npy" a_size)
if(NOT c_size EQUAL 176 OR NOT a_size EQUAL 7328)
  message(FATAL_ERROR "output sizes: centroids ${c_size} (expected 176), assignments ${a_size} (expected 7328)")
endif()
file(GLOB leftovers "${WORK_DIR}/*.tmp*" "${WORK_DIR}/.*.tmp*")
if(leftovers)
  message(FATAL_ERROR "temporary files left behind: ${leftovers}")
endif()

# Elkan's variant finds the same clusters.
run(0 out err --input data.npy --labels labels.npy --k 3 --algorithm elkan)
last_line("${out}" s)
string(JSON ari GET "${s}" adjusted_rand_index)
if(NOT ari EQUAL 1)
  message(FATAL_ERROR "elkan on data.npy: ${s}")
endif()
run(2 out err --algorithm hamerly)
expect_match("${err}" "--algorithm must be lloyd or elkan" "bad algorithm")

# A config file sets the options; the command line wins over it.
file(WRITE "${WORK_DIR}/run.json" "{\"input\": \"data.npy\", \"k\": 5, \"max_iter\": 1, \"init\": \"random\", \"metric\": \"cosine\"}")
run(0 out err --config run.json --k 3)
last_line("${out}" s)
string(JSON k GET "${s}" k)
string(JSON iterations GET "${s}" iterations)
if(NOT k EQUAL 3 OR NOT iterations EQUAL 1)
  message(FATAL_ERROR "config run: ${s}")
endif()

# Bad inputs: status 1 and the library's message naming the file or the values.
run(1 out err --input missing.npy)
expect_match("${err}" "\\[read_npy\\] cannot open 'missing.npy': no such file" "missing file")
run(1 out err --input data.npy --k 5000)
expect_match("${err}" "\\[kmeans\\] k = 5000 exceeds the number of points N = 900" "k > N")
run(1 out err --input data.npy --format raw --shape 10,10)
expect_match("${err}" "\\[read_raw_float32\\] 'data.npy' holds" "raw size mismatch")
run(1 out err --input data.npy --labels c.npy --k 3)
expect_match("${err}" "labels 'c.npy' must hold integers" "float labels")

# Issue 27. Defect 6: an output naming the input or another output is a usage
# error (it overwrote the data and lost the centroids).
run(2 out err --input data.npy --k 3 --assignments ./data.npy)
expect_match("${err}" "--input and --assignments name the same file './data.npy'" "output over the input")
run(2 out err --input data.npy --k 3 --centroids o.npy --assignments o.npy)
expect_match("${err}" "--centroids and --assignments name the same file" "two outputs, one file")
# Defect 15: a number out of JSON's range is a config error naming the file.
file(WRITE "${WORK_DIR}/huge.json" "{\"k\": 1e400}")
run(2 out err --config huge.json)
expect_match("${err}" "config file 'huge.json' is not valid JSON" "k = 1e400")
# Defect 7: a FIFO named like the input is an error, not a hang.
execute_process(COMMAND mkfifo "${WORK_DIR}/fifo.npy" RESULT_VARIABLE mkfifo_rc)
if(mkfifo_rc EQUAL 0)
  run(1 out err --input fifo.npy --k 3)
  expect_match("${err}" "'fifo.npy' is not a regular file \\(it is a FIFO\\)" "FIFO input")
  # An output path naming a FIFO is refused, not replaced by a plain file (the atomic rename did that).
  run(1 out err --input data.npy --k 3 --centroids fifo.npy)
  expect_match("${err}" "cannot write 'fifo.npy': it is a FIFO, not a regular file" "FIFO output")
  execute_process(COMMAND test -p "${WORK_DIR}/fifo.npy" RESULT_VARIABLE still_fifo)
  if(NOT still_fifo EQUAL 0)
    message(FATAL_ERROR "FIFO output: fifo.npy is no longer a FIFO")
  endif()
endif()
# A failed write of the results to stdout (a full disk) is exit status 1, not 0.
if(EXISTS /dev/full)
  execute_process(COMMAND "${APP}" --input data.npy --k 3 WORKING_DIRECTORY "${WORK_DIR}" OUTPUT_FILE /dev/full
                  RESULT_VARIABLE full_rc ERROR_VARIABLE full_err)
  if(NOT full_rc EQUAL 1 OR NOT full_err MATCHES "writing the results to stdout failed")
    message(FATAL_ERROR "stdout to /dev/full: exit status ${full_rc}, stderr: ${full_err}")
  endif()
endif()
# Defect 9: 0 rows of 4 values: the message shows (0,4) and the file, not (0,0).
execute_process(COMMAND sh -c "printf '\\223NUMPY\\001\\000v\\000%-117s\\n' \"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }\" > empty.npy"
  WORKING_DIRECTORY "${WORK_DIR}")
run(1 out err --input empty.npy --k 3)
expect_match("${err}" "'empty.npy' holds no vectors: it is float32 \\(0,4\\)" "0 rows")
# Negative labels: refused when read, naming the file, before the fit and before any output is written
# (the adjusted Rand index refused them after both, naming a (cluster, label) pair and no file).
execute_process(COMMAND sh -c "printf '\\223NUMPY\\001\\000v\\000%-117s\\n' \"{'descr': '<i8', 'fortran_order': False, 'shape': (900,), }\" > neg.npy && head -c 7200 /dev/zero | tr '\\000' '\\377' >> neg.npy"
  WORKING_DIRECTORY "${WORK_DIR}")
file(REMOVE "${WORK_DIR}/neg_c.npy")
run(1 out err --input data.npy --labels neg.npy --k 3 --centroids neg_c.npy)
expect_match("${err}" "labels 'neg.npy' must be non-negative class ids, got -1 at position 0" "negative labels")
if(EXISTS "${WORK_DIR}/neg_c.npy")
  message(FATAL_ERROR "negative labels: --centroids was written before the labels were refused")
endif()
# --scale scales an --input (the demo's data is generated; it was ignored there without a word)
run(2 out err --demo-n 100 --k 2 --scale 1000)
expect_match("${err}" "--format, --shape, --labels and --scale need --input" "--scale without --input")
# Defect 10: values whose squares overflow float32 (1e31, and 1.3e38 near the
# float32 maximum) cluster exactly as the unscaled data (range scaling).
foreach(scale 1e30 1e37 1e-30)
  run(0 out err --input data.npy --labels labels.npy --k 3 --scale ${scale} --centroids big_c.npy)
  last_line("${out}" s)
  string(JSON ari GET "${s}" adjusted_rand_index)
  if(NOT ari EQUAL 1)
    message(FATAL_ERROR "clustering data.npy scaled by ${scale}: ${s}")
  endif()
endforeach()
# Defect 14: a write that fails (here a file-size limit, as on a full disk) says why.
execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 1; exec \"$0\" \"$@\"" "${APP}"
    --input data.npy --k 3 --assignments fsz.npy
  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "write past the file-size limit: exit status ${rc}, expected 1\n${err}")
endif()
expect_match("${err}" "\\[save_npy\\] fsz.npy: writing the temporary file '.*' failed: File too large" "failed write")
file(GLOB leftovers "${WORK_DIR}/.fsz.npy.tmp*")
if(leftovers)
  message(FATAL_ERROR "temporary files left behind by a failed write: ${leftovers}")
endif()

# IDX input, when the Debian package dataset-fashion-mnist is installed: the test
# images (10000 x 28 x 28 bytes, gzip) flattened to rows of 784.
set(fmnist /usr/share/datasets/fashion-mnist)
if(EXISTS "${fmnist}/t10k-images-idx3-ubyte.gz" AND EXISTS "${fmnist}/t10k-labels-idx1-ubyte.gz")
  run(0 out err --input "${fmnist}/t10k-images-idx3-ubyte.gz" --labels "${fmnist}/t10k-labels-idx1-ubyte.gz"
      --k 10 --max-iter 5 --scale 0.00392156862745098 --assignments fm.npy)
  last_line("${out}" s)
  string(JSON n GET "${s}" n)
  string(JSON d GET "${s}" d)
  string(JSON ari GET "${s}" adjusted_rand_index)
  # Ten clothing classes are not ten round blobs: the clusters agree with the
  # classes only partly, but far above chance (0).
  if(NOT n EQUAL 10000 OR NOT d EQUAL 784 OR ari LESS 0.2)
    message(FATAL_ERROR "Fashion-MNIST t10k: ${s}")
  endif()
else()
  message(STATUS "Fashion-MNIST not installed: IDX input not exercised here (see tests/nn/test_data_readers.cpp)")
endif()
