# On a CPU with AVX512-BF16, bitsandbytes 0.50 logs this warning when train_network.py imports it
# (its CPU backend tries to fetch a kernel and no `kernels` package is installed). The bed's machine
# may lack that CPU feature; this prints the same line at the same moment, so every machine sees
# the log the real trainer prints there.
import sys

if sys.argv and sys.argv[0].endswith("train_network.py"):
    print("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make sure "
          "you already `pip install kernels` and the kernels >= 0.11.1", file=sys.stderr, flush=True)
