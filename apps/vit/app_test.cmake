# Tests of cf-vit (run by CTest: cmake -DAPP=... -DWORK_DIR=... -DMODE=smoke|errors -P this file).
#   errors: bad command lines and config files exit with status 2 and a message
#           naming the bad option; a missing data folder exits with 1.
#   smoke:  a tiny config (200 images, 2 layers, a few steps) trains the plain ViT,
#           a centroid ViT and its overlapping-patch version, checks the summary
#           (accuracies, MACs: the centroid block costs less), reuses its
#           checkpoints and refuses a stale one; exits with 77 (CTest: skipped)
#           when the Debian package dataset-fashion-mnist is missing.
include(${CMAKE_CURRENT_LIST_DIR}/../common/app_test_lib.cmake)

if(MODE STREQUAL "errors")
  check_option_errors(steps)

  run(2 out err --centroid-at 0,5)
  expect_match("${err}" "--centroid-at: layer 5 out of range \\(0: no centroid block, 1..4: the layer replaced\\)"
               "centroid layer out of range")
  run(2 out err --centroid-at 3 --n-layers 2)
  expect_match("${err}" "--centroid-at: layer 3 out of range" "centroid layer beyond --n-layers")
  run(2 out err --centroid-at -1)
  expect_match("${err}" "--centroid-at: every entry must be at least 0, got -1" "negative centroid layer")
  run(2 out err --patch-kernel 5)
  expect_match("${err}" "patches of kernel 5, stride 5, padding 0 do not tile the 28 x 28 image" "patch not dividing")
  run(2 out err --patch-kernel 30)
  expect_match("${err}" "the patch kernel 30 is larger than the image" "patch too large")
  run(2 out err --overlap 4,3)
  expect_match("${err}" "--overlap must be kernel,stride,padding" "overlap not a triple")
  run(2 out err --overlap 4,3,1)
  expect_match("${err}" "--overlap: patches of kernel 4, stride 3, padding 1 do not tile" "overlap not tiling")
  run(2 out err --overlap 4,3,0 --centroid-at 0)
  expect_match("${err}" "--overlap applies to the centroid variants, and --centroid-at lists none" "overlap unused")
  run(2 out err --d-model 30 --n-heads 4)
  expect_match("${err}" "--d-model \\(30\\) must be divisible by --n-heads \\(4\\)" "heads")
  run(2 out err --train-size 59500 --val-size 1000)
  expect_match("${err}" "--train-size \\+ --val-size \\(60500\\) exceeds the 60000 training images" "train size")
  run(2 out err --test-size 10001)
  expect_match("${err}" "--test-size \\(10001\\) exceeds the 10000 test images" "test size")
  run(2 out err --dropout 1)
  expect_match("${err}" "--dropout must be in \\[0, 1\\)" "dropout")
  run(2 out err --seed 1 --seeds 1,2)
  expect_match("${err}" "give --seed or --seeds, not both" "seed and seeds")
  run(2 out err --steps 10 --warmup 10)
  expect_match("${err}" "--warmup \\(10\\) must be less than --steps \\(10\\)" "warmup >= steps")
  file(WRITE "${WORK_DIR}/bad_list.json" "{\"centroid_at\": [0, \"two\"]}")
  run(2 out err --config bad_list.json)
  expect_match("${err}" "config key 'centroid_at' must be an array of integers" "mistyped list")
  run(1 out err --data-dir "${WORK_DIR}/no-such-dir" --steps 2 --warmup 1)
  expect_match("${err}" "no-such-dir" "missing data folder named")
  # A folder smaller than the full data set, or of another image size, is refused by name (it crashed:
  # the subsets read the counts asked for past the end). IDX files written with Python's standard library.
  write_fashion_mnist(small 100 20 28)
  write_fashion_mnist(side14 100 20 14)
  set(tiny_run --d-model 8 --n-heads 2 --d-ff 8 --n-layers 2 --centroid-at 0 --steps 2 --warmup 1
      --batch-size 8 --patch-kernel 7)
  run(1 out err --data-dir "${WORK_DIR}/small" --train-size 90 --val-size 20 --test-size 10 ${tiny_run})
  expect_match("${err}" "small holds 100 training and 20 test images; --train-size \\+ --val-size = 110"
               "a folder with too few images")
  run(1 out err --data-dir "${WORK_DIR}/side14" --train-size 40 --val-size 10 --test-size 10 ${tiny_run})
  expect_match("${err}" "side14: images are \\(100,14,14\\), the model takes 28 x 28" "another image size")
  return()
endif()

if(NOT MODE STREQUAL "smoke")
  message(FATAL_ERROR "MODE must be smoke or errors, got '${MODE}'")
endif()

if(NOT EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz AND
   NOT EXISTS /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte)
  message("Fashion-MNIST is not installed (Debian package 'dataset-fashion-mnist'): smoke test skipped")
  cmake_language(EXIT 77)  # CTest's SKIP_RETURN_CODE
endif()

# 200 training images, 2 layers of d 16, 7x7 patches (16 tokens), 6 steps: the
# plain ViT, the centroid block at layer 2 and its overlapping-patch version.
set(tiny --train-size 200 --val-size 50 --test-size 100 --patch-kernel 7 --d-model 16 --n-heads 2 --d-ff 32
    --n-layers 2 --centroid-at 0,2 --overlap 7,3,0 --steps 6 --warmup 2 --batch-size 16 --eval-every 3
    --log-every 3 --seed 3 --checkpoint-dir ckpt)
run(0 out err ${tiny})
last_line("${out}" summary)
string(JSON test_size GET "${summary}" test_size)
if(NOT test_size EQUAL 100)
  message(FATAL_ERROR "smoke: test_size ${test_size}, expected 100")
endif()
foreach(v plain centroid2 centroid2-overlap)
  string(JSON acc GET "${summary}" table ${v} accuracy_mean)
  string(JSON t GET "${summary}" table ${v} train_s_mean)
  string(JSON m GET "${summary}" table ${v} train_peak_mib_mean)
  string(JSON p GET "${summary}" table ${v} params)
  string(JSON macs_${v} GET "${summary}" table ${v} macs)
  string(JSON tokens_${v} GET "${summary}" table ${v} tokens)
  if(acc LESS 0 OR acc GREATER 1 OR NOT t GREATER 0 OR NOT m GREATER 0 OR NOT p GREATER 1000 OR
     NOT macs_${v} GREATER 0)
    message(FATAL_ERROR "smoke: ${v}: accuracy ${acc}, train time ${t}, peak MiB ${m}, params ${p}, MACs ${macs_${v}}")
  endif()
endforeach()
# 28 / 7 = 4 x 4 patches; overlapping 7/3/0: (28 - 7) / 3 + 1 = 8 x 8.
if(NOT tokens_plain EQUAL 16 OR NOT tokens_centroid2 EQUAL 16 OR NOT tokens_centroid2-overlap EQUAL 64)
  message(FATAL_ERROR "smoke: tokens ${tokens_plain} / ${tokens_centroid2} / ${tokens_centroid2-overlap}, expected 16 / 16 / 64")
endif()
# The centroid block shortens the sequence (16 -> 4 tokens): fewer MACs than the plain ViT.
if(NOT macs_centroid2 LESS macs_plain)
  message(FATAL_ERROR "smoke: MACs with the centroid block (${macs_centroid2}) not below the plain ViT's (${macs_plain})")
endif()
if(NOT macs_centroid2-overlap GREATER macs_centroid2)
  message(FATAL_ERROR "smoke: overlapping patches (${macs_centroid2-overlap}) not costlier than plain ones (${macs_centroid2})")
endif()
expect_match("${out}" "\"event\":\"train\",\"seed\":3,\"run\":\"centroid2\",\"step\":3," "train lines")
expect_match("${out}" "\"event\":\"val\",\"seed\":3,\"run\":\"plain\",\"step\":6," "val lines")
expect_match("${err}" "\\| centroid@2 overlap \\| 64 \\|" "Markdown table")
foreach(f plain-seed3 centroid2-seed3 centroid2-overlap-seed3)
  if(NOT EXISTS "${WORK_DIR}/ckpt/${f}.safetensors")
    message(FATAL_ERROR "smoke: checkpoint ${f}.safetensors not written")
  endif()
endforeach()

# The second run reuses the finished checkpoints: no training, the same test accuracies.
run(0 out2 err2 ${tiny})
last_line("${out2}" summary2)
expect_match("${out2}" "\"event\":\"resume\",\"seed\":3,\"run\":\"plain\"" "resume line")
if(out2 MATCHES "\"event\":\"train\"")
  message(FATAL_ERROR "smoke: a finished checkpoint was trained again:\n${out2}")
endif()
foreach(v plain centroid2 centroid2-overlap)
  expect_same_json("${summary}" "${summary2}" "reloaded vs trained" table ${v} accuracy_mean)
  expect_null_json("${summary2}" "reused model" table ${v} train_s_mean)
  expect_null_json("${summary2}" "reused model" table ${v} train_peak_mib_mean)
endforeach()
# A checkpoint written with other settings is refused, naming the file.
run(1 out err ${tiny} --lr 0.01)
expect_match("${err}" "checkpoint 'ckpt/plain-seed3.safetensors' was written with other settings" "stale checkpoint")
