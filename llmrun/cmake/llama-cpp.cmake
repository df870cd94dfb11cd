# Included into llama-cpp-python's CMake build by the quick start's first line:
#   CMAKE_ARGS="-DCMAKE_PROJECT_INCLUDE=$PWD/llmrun/cmake/llama-cpp.cmake" pip install -e '.[demo]'
# It runs after llama-cpp-python's project() and before llama.cpp's options are declared, so a
# value set here is the option's default; -D flags in CMAKE_ARGS still win.
include_guard(GLOBAL)

# 1. llama.cpp's RPC backend, for `--rpc` (one model's layers on ggml-rpc-server workers):
#    about 30 s more to build, nothing at run time when unused.
if(NOT DEFINED GGML_RPC)
    set(GGML_RPC ON CACHE BOOL "ggml: use RPC (llmrun --rpc)")
endif()

# 2. No AMX. pip builds llama.cpp tuned to the host (-march=native). On a CPU that advertises AMX
# (Intel Sapphire Rapids and later) that turns on llama.cpp's AMX kernels, and in the
# llama.cpp that llama-cpp-python 0.3.x vendors they die with a general protection fault
# (SIGSEGV) on the first ldtilecfg of ggml_backend_amx_mul_mat: the tile configuration
# built on the stack is mostly optimized away (llama.cpp PR 26954). These flags remove
# only AMX and keep everything else the host has (AVX-512, VNNI, BF16). Measured with
# benchmarks/bench_builds.py: such a build processes prompts 1.5x faster than a portable
# AVX2 build on an AVX-512 machine, and decodes 3.5% faster.
# A no-op on other CPUs (ARM, Apple silicon) and with compilers that do not know AMX.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    include(CheckCCompilerFlag)
    check_c_compiler_flag(-mno-amx-int8 LLMRUN_COMPILER_KNOWS_AMX)
    if(LLMRUN_COMPILER_KNOWS_AMX)
        add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-mno-amx-tile;-mno-amx-int8;-mno-amx-bf16>")
    endif()
endif()
