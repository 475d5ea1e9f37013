// What coopmat's few-row tile design reaches when written in CUDA, with and without what
// Vulkan does not give it (cp.async global->shared copies; more than 48 KiB of shared
// memory), beside cuBLAS in the same process. Not part of the library: evidence for
// docs/kernels.md ("Sizes compiled in for 32 and 64 rows; the same design in CUDA").
//
// The product is a decode-shaped linear layer, D (M x N) = X (M x K) @ W^T with W stored
// N x K (coopmat's x @ w.T: B column-major), float16 operands, float32 sums, float16 D.
// A workgroup of 4 warps owns a TM x TN tile of D (all M rows), K steps of TK; X's and W's
// tiles are staged in shared memory (rows padded by 16 bytes), fragments come through
// ldmatrix into mma.sync m16n8k16 (a subgroup-scope cooperative matrix is one warp's).
// Staging modes:
//   regs1:  global -> registers -> shared, one stage, two barriers per K step, the next
//           step's loads in flight during the multiply (coopmat's buffering 2);
//   regs2:  the same with two register sets, loads two K steps ahead (buffering 5);
//   cpasyncS: cp.async into S stages, one barrier per K step.
// Each line: microseconds per product (median of 7 timings of 50 launches back to back,
// CUDA events), weight bytes read per second, shared memory, registers, and a check of 64
// sampled elements against a float64 host dot product. First, the time of an empty
// kernel launched back to back (the launch floor). -DNO_CUBLAS builds without cuBLAS.
//
//   nvcc -O3 -arch=sm_90 -lcublas -o /tmp/few_rows lab/cuda/few_rows_ceiling.cu && /tmp/few_rows
#ifndef NO_CUBLAS
#include <cublas_v2.h>
#endif
#include <cuda_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe.cuh"

__device__ __forceinline__ void cp_async16(uint32_t s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(g));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

enum Mode { REGS1, REGS2, CPASYNC };

// WM_: warps along M (4 / WM_ along N).
template <int TM, int TN, int TK, int WM_, Mode MODE, int STAGES>
__global__ void __launch_bounds__(128) few_rows(const half* __restrict__ X, const half* __restrict__ W,
                                                half* __restrict__ D, int N, int K) {
  constexpr int WN_ = 4 / WM_;
  constexpr int S = TK + 8;  // padded row (halfs)
  constexpr int ASZ = TM * S, BSZ = TN * S;
  constexpr int LINE = TK / 8;  // 16-byte units per row
  constexpr int AU = TM * LINE / 128, BU = TN * LINE / 128;
  static_assert(AU >= 1 && BU >= 1 && TM * LINE % 128 == 0 && TN * LINE % 128 == 0, "units");
  constexpr int WTM = TM / WM_, WTN = TN / WN_, FM = WTM / 16, FN = WTN / 8;
  static_assert(FM >= 1 && FN >= 2 && FN % 2 == 0, "warp tile");
  extern __shared__ __align__(16) half sh[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN_, wn = warp % WN_;
  const int n0 = blockIdx.x * TN;
  const int NK = K / TK;
  float acc[FM][FN][4] = {};

  auto a_src = [&](int u, int k0) { return X + (size_t)(u / LINE) * K + k0 + (u % LINE) * 8; };
  auto b_src = [&](int u, int k0) { return W + (size_t)(n0 + u / LINE) * K + k0 + (u % LINE) * 8; };
  auto a_dst = [&](int u, int st) { return sh + st * (ASZ + BSZ) + (u / LINE) * S + (u % LINE) * 8; };
  auto b_dst = [&](int u, int st) { return sh + st * (ASZ + BSZ) + ASZ + (u / LINE) * S + (u % LINE) * 8; };

  auto compute = [&](int st) {
    const half* As = sh + st * (ASZ + BSZ);
    const half* Bs = As + ASZ;
#pragma unroll
    for (int kk = 0; kk < TK; kk += 16) {
      uint32_t a[FM][4];
#pragma unroll
      for (int i = 0; i < FM; ++i)
        ldsm_x4(a[i], smem_u32(As + (wm * WTM + i * 16 + lane % 16) * S + kk + (lane / 16) * 8));
#pragma unroll
      for (int j = 0; j < FN; j += 2) {
        uint32_t b[4];  // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        ldsm_x4(b, smem_u32(Bs + (wn * WTN + j * 8 + lane % 8 + (lane / 16) * 8) * S + kk + ((lane / 8) % 2) * 8));
#pragma unroll
        for (int i = 0; i < FM; ++i) { mma(acc[i][j], a[i], b[0], b[1]); mma(acc[i][j + 1], a[i], b[2], b[3]); }
      }
    }
  };

  if constexpr (MODE == REGS1 || MODE == REGS2) {
    constexpr int SETS = MODE == REGS1 ? 1 : 2;
    uint4 ra[SETS][AU], rb[SETS][BU];
    auto load = [&](int set, int kt) {
      if (kt >= NK) return;
#pragma unroll
      for (int q = 0; q < AU; ++q) ra[set][q] = *(const uint4*)a_src(tid + q * 128, kt * TK);
#pragma unroll
      for (int q = 0; q < BU; ++q) rb[set][q] = *(const uint4*)b_src(tid + q * 128, kt * TK);
    };
    auto stage = [&](int set) {
      __syncthreads();
#pragma unroll
      for (int q = 0; q < AU; ++q) *(uint4*)a_dst(tid + q * 128, 0) = ra[set][q];
#pragma unroll
      for (int q = 0; q < BU; ++q) *(uint4*)b_dst(tid + q * 128, 0) = rb[set][q];
      __syncthreads();
    };
#pragma unroll
    for (int s = 0; s < SETS; ++s) load(s, s);
    for (int kt = 0; kt < NK; kt += SETS) {
#pragma unroll
      for (int s = 0; s < SETS; ++s) {
        if (kt + s < NK) {
          stage(s);
          load(s, kt + s + SETS);
          compute(0);
        }
      }
    }
  } else {
    auto issue = [&](int kt) {
      int st = kt % STAGES;
      if (kt < NK) {
#pragma unroll
        for (int q = 0; q < AU; ++q) cp_async16(smem_u32(a_dst(tid + q * 128, st)), a_src(tid + q * 128, kt * TK));
#pragma unroll
        for (int q = 0; q < BU; ++q) cp_async16(smem_u32(b_dst(tid + q * 128, st)), b_src(tid + q * 128, kt * TK));
      }
      cp_commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (int kt = 0; kt < NK; ++kt) {
      cp_wait<STAGES - 2>();
      __syncthreads();
      issue(kt + STAGES - 1);
      compute(kt % STAGES);
    }
  }
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      int r = wm * WTM + i * 16 + g, c = n0 + wn * WTN + j * 8 + 2 * t;
      *(__half2*)(D + (size_t)r * N + c) = __floats2half2_rn(acc[i][j][0], acc[i][j][1]);
      *(__half2*)(D + (size_t)(r + 8) * N + c) = __floats2half2_rn(acc[i][j][2], acc[i][j][3]);
    }
}

__global__ void empty_kernel() {}

static int M, N, K;
static std::vector<half> hX, hW, hD;
static half *dX, *dW, *dD;


const char* check() {
  CK(cudaMemcpy(hD.data(), dD, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
  for (int s = 0; s < 64; ++s) {
    int r = (s * 7) % M, c = (s * 1543 + 11) % N;
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += (double)__half2float(hX[(size_t)r * K + k]) * __half2float(hW[(size_t)c * K + k]);
    if (fabs(ref - __half2float(hD[(size_t)r * N + c])) > 2e-3 + 2e-3 * fabs(ref)) return "WRONG";
  }
  return "ok";
}

void report(const char* name, float us, int smem, int regs) {
  printf("  %-30s %7.1f us %5.2f TB/s  smem %6d%s regs %3d  %s\n", name, us, (double)N * K * 2 / us / 1e6,
         smem, smem > 49152 ? "*" : " ", regs, check());
}

template <int TM, int TN, int TK, int WM_, Mode MODE, int STAGES = 1>
void bench() {
  if (TM != M) return;
  auto k = few_rows<TM, TN, TK, WM_, MODE, STAGES>;
  int smem = (MODE == CPASYNC ? STAGES : 1) * (TM + TN) * (TK + 8) * 2;
  if (smem > 227 * 1024) return;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, k));
  CK(cudaMemset(dD, 0, (size_t)M * N * 2));
  float us = time_us([&] { k<<<N / TN, 128, smem>>>(dX, dW, dD, N, K); });
  char name[64];
  snprintf(name, sizeof name, "%s %dx%dx%d w%dx%d", MODE == REGS1 ? "regs1" : MODE == REGS2 ? "regs2" : "cpasync",
           TM, TN, TK, WM_, 4 / WM_);
  if (MODE == CPASYNC) snprintf(name + strlen(name), sizeof name - strlen(name), " s%d", STAGES);
  report(name, us, smem, fa.numRegs);
}

template <int TM, int TN, int TK, int WM_>
void modes() {
  bench<TM, TN, TK, WM_, REGS1>();
  bench<TM, TN, TK, WM_, REGS2>();
  bench<TM, TN, TK, WM_, CPASYNC, 2>();
  bench<TM, TN, TK, WM_, CPASYNC, 3>();
  bench<TM, TN, TK, WM_, CPASYNC, 4>();
  bench<TM, TN, TK, WM_, CPASYNC, 6>();
}

int main(int argc, char** argv) {
  int cases[][3] = {{16, 4096, 14336}, {32, 4096, 14336}, {64, 4096, 14336}};
#ifndef NO_CUBLAS
  cublasHandle_t h; cublasCreate(&h);
#endif
  printf("empty kernel, launches back to back: %.1f us each\n", time_us([] { empty_kernel<<<1, 32>>>(); }));
  for (auto& c : cases) {
    M = c[0]; K = c[1]; N = c[2];
    hX.resize((size_t)M * K); hW.resize((size_t)N * K); hD.resize((size_t)M * N);
    uint32_t x = 12345;
    for (auto& v : hX) { x = x * 1664525u + 1013904223u; v = __float2half(((x >> 9) & 1023) / 512.0f - 1.0f); }
    for (auto& v : hW) { x = x * 1664525u + 1013904223u; v = __float2half((((x >> 9) & 1023) / 512.0f - 1.0f) / 64); }
    CK(cudaMalloc(&dX, hX.size() * 2)); CK(cudaMalloc(&dW, hW.size() * 2)); CK(cudaMalloc(&dD, hD.size() * 2));
    CK(cudaMemcpy(dX, hX.data(), hX.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dW, hW.data(), hW.size() * 2, cudaMemcpyHostToDevice));
    printf("== %d x %d @ (%d x %d)^T, float16, float32 sums\n", M, K, N, K);
#ifndef NO_CUBLAS
    float one = 1, zero = 0;
    CK(cudaMemset(dD, 0, (size_t)M * N * 2));
    float us = time_us([&] {
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, dW, CUDA_R_16F, K, dX, CUDA_R_16F, K, &zero, dD,
                   CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    report("cuBLAS", us, 0, 0);
#endif
    modes<16, 64, 64, 1>();
    modes<16, 64, 128, 1>();
    modes<16, 64, 256, 1>();
    modes<32, 64, 64, 2>();
    modes<32, 64, 128, 2>();
    modes<32, 64, 256, 2>();
    modes<64, 64, 64, 2>();
    modes<64, 64, 128, 2>();
    modes<64, 128, 64, 2>();
    cudaFree(dX); cudaFree(dW); cudaFree(dD);
  }
  return 0;
}
