# The device-memory cap (volley-peer --gpu-mem) on a real device: counted,
# refused like a full card, and a trainer's fallback to the CPU. Only with
# the CUDA kernels; without a device it reports itself skipped (exit 77).
if(VOLLEY_HAVE_CUDA)
  volley_unit_test(test_gpu_memory volley_peer)
endif()
