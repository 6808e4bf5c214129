set -u
cd .dev/perf/jaxtests
export JAX_PLATFORMS=vmm,cpu XLA_VMM_LIBRARY=$PWD/../lib/libxla_vmm_plugin.so PYTHONPATH=$PWD/../../../integration XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONFAULTHANDLER=1 RUST_BACKTRACE=1 JAX_NUM_GENERATED_CASES=2 TF_CPP_MIN_LOG_LEVEL=0
i=0
for t in lax_test.py::LaxTest::testConv0 lax_test.py::LaxTest::testSort1 memories_test.py::ComputeOffload::test_compute_on_basic_inline memories_test.py::DevicePutTest::test_host_to_device_transfer buffer_callback_test.py::BufferCallbackTest::test_cuda_array_interface0 buffer_callback_test.py::BufferCallbackTest::test_side_effect api_test.py::APITest::test_ensure_compile_time_eval_no_leaks lax_control_flow_test.py::LaxControlFlowTest::testAssociativeScanSolvingRegressionTest_2 nn_test.py::NNInitializersTest::testInitializer16 lax_test.py::LaxTest::test_gather_with_asymmetric_dtype lax_test.py::CompositeTest::test_composite_with_attributes python_callback_test.py::PythonCallbackTest::test_callback_inside_of_cond_io_ordered "api_test.py -k token" "array_test.py -k pinned_host_npy_value_doesnt_cache0" "lax_numpy_test.py::LaxBackedNumpyTests::testPoly0"; do
  i=$((i+1)); ( timeout 100 python3 -m pytest -s -q -p no:cacheprovider $t > $OUT/d$i.log 2>&1; echo "rc=$? $t" >> $OUT/d$i.log ) &
done
wait
for f in $OUT/d*.log; do echo "=================== $f"; tail -1 $f; grep -v "^\s*$" $f | grep -B2 -A12 -m3 -i "fatal\|abort\|panick\|check failed\|error\b\|Error:" | head -40; done
