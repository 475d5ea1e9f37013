#version 450
// D = alpha * A @ B + beta * C on VK_KHR_cooperative_matrix: the tiled kernel that
// coopmat/codegen/khr_tiled.py generates (its general variant, buffering 2), written by
// hand in GLSL so that a reader can follow the design. tests/test_shaders.py compiles
// this file and checks it on lavapipe against numpy and against the generated kernel.
//
// Per workgroup (a TILE_M x TILE_N block of D; batch = gl_WorkGroupID.z):
//
//     prefetch K step 0 of A and B into registers
//     for k0 in 0, TILE_K, 2 TILE_K, ... < K:
//         barrier; registers -> shared memory; barrier
//         prefetch K step k0 + TILE_K into registers   (in flight during the multiply)
//         per COOP_K slice of the step: load the A and B fragments from shared memory,
//             multiply-accumulate into this subgroup's grid of accumulators
//     per accumulator: D = alpha * acc + beta * C
//         workgroup tile inside D (and C/D aligned): cooperative-matrix load/store
//         workgroup tile straddling an edge: through shared scratch, element by element
//             with bounds checks
//
// Interface (coopmat/codegen/abi.py; the dispatcher runs this shader and the generated
// kernel the same way): storage buffers A=0, B=1, D=2, C=3 in descriptor set 0; the push
// constants below; workgroup (x, y, z) = (column tile, row tile, batch).
//
// Parameters:
//   element types, as preprocessor defines (glslang -DNAME=VALUE; defaults in brackets):
//     AB_TYPE      A and B: float16_t, int8_t or uint8_t               [float16_t]
//     AB_BYTES     size of AB_TYPE in bytes, for the shared-memory padding   [2]
//     D_TYPE       C, D and the accumulators: float16_t, float, int32_t, uint32_t [float]
//     SCALAR_TYPE  alpha and beta as the push constants hold them: float for float
//                  results (even float16_t ones), D_TYPE for integer results  [float]
//     HAS_C        defined: D = alpha * A @ B + beta * C; undefined: D = alpha * A @ B
//                  and the shader has no binding 3                      [undefined]
//   sizes and layouts, as specialization constants (set when the pipeline is created;
//   the defaults are lavapipe's 8x8x8 matrices with the generated kernel's CPU tile).

#pragma use_vulkan_memory_model
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_control_flow_attributes : require

#ifndef AB_TYPE
#define AB_TYPE float16_t
#define AB_BYTES 2
#endif
#ifndef D_TYPE
#define D_TYPE float
#define SCALAR_TYPE float
#endif
#if !defined(AB_BYTES) || !defined(SCALAR_TYPE)
#error "AB_TYPE needs AB_BYTES beside it, and D_TYPE needs SCALAR_TYPE"
#endif

// The cooperative matrix shape: one of the device's VkCooperativeMatrixPropertiesKHR.
layout(constant_id = 0) const uint COOP_M = 8;
layout(constant_id = 1) const uint COOP_N = 8;
layout(constant_id = 2) const uint COOP_K = 8;
// The workgroup tile: a TILE_M x TILE_N block of D, computed in K steps of TILE_K by a
// SUBGROUPS_M x SUBGROUPS_N grid of subgroups.
layout(constant_id = 3) const uint TILE_M = 32;
layout(constant_id = 4) const uint TILE_N = 32;
layout(constant_id = 5) const uint TILE_K = 16;
layout(constant_id = 6) const uint SUBGROUPS_M = 2;
layout(constant_id = 7) const uint SUBGROUPS_N = 2;
// How A and B lie in memory. C and D are always row-major.
layout(constant_id = 8) const bool A_COLUMN_MAJOR = false;
layout(constant_id = 9) const bool B_COLUMN_MAJOR = false;
// Invocations per workgroup: SUBGROUPS_M * SUBGROUPS_N * the subgroup size, which the
// pipeline must fix (VK_EXT_subgroup_size_control) with full subgroups, so that
// gl_SubgroupID numbers whole subgroups. (glslang writes this as LocalSizeId, which
// needs Vulkan 1.3's maintenance4 feature enabled.)
layout(local_size_x_id = 10, local_size_x = 32) in;

const uint INVOCATIONS = gl_WorkGroupSize.x;
const uint NUM_SUBGROUPS = SUBGROUPS_M * SUBGROUPS_N;

// Each subgroup owns a SUBGROUP_ROWS x SUBGROUP_COLS block of the tile and holds it as an
// ACC_ROWS x ACC_COLS grid of COOP_M x COOP_N accumulators.
const uint SUBGROUP_ROWS = TILE_M / SUBGROUPS_M;
const uint SUBGROUP_COLS = TILE_N / SUBGROUPS_N;
const uint ACC_ROWS = SUBGROUP_ROWS / COOP_M;
const uint ACC_COLS = SUBGROUP_COLS / COOP_N;

#define MAT_A coopmat<AB_TYPE, gl_ScopeSubgroup, COOP_M, COOP_K, gl_MatrixUseA>
#define MAT_B coopmat<AB_TYPE, gl_ScopeSubgroup, COOP_K, COOP_N, gl_MatrixUseB>
#define MAT_ACC coopmat<D_TYPE, gl_ScopeSubgroup, COOP_M, COOP_N, gl_MatrixUseAccumulator>

layout(set = 0, binding = 0, std430) restrict readonly buffer BufferA { AB_TYPE A[]; };
layout(set = 0, binding = 1, std430) restrict readonly buffer BufferB { AB_TYPE B[]; };
layout(set = 0, binding = 2, std430) writeonly buffer BufferD { D_TYPE D[]; };
#ifdef HAS_C  // without C, binding 3 does not exist (and beta is unused)
layout(set = 0, binding = 3, std430) readonly buffer BufferC { D_TYPE C[]; };
#endif

// Fourteen 4-byte values, in abi.PUSH_FIELDS order. Leading dimensions and batch strides
// count elements; a batch stride of 0 gives every batch the same matrix.
layout(push_constant) uniform PushConstants {
    uint M, N, K;
    uint lda, ldb, ldc, ldd;
    uint batch_stride_a, batch_stride_b, batch_stride_c, batch_stride_d;
    SCALAR_TYPE alpha, beta;
    uint flags;
} p;

// flags bit 0: the dispatcher found C and D (strides and batch offsets) aligned as
// cooperative-matrix loads and stores require (abi.FLAG_DIRECT_CD).
const uint FLAG_DIRECT_CD = 1u;

// ---- Staging A and B through shared memory ----------------------------------------------
//
// Shared memory keeps each operand in its global orientation: a tile is a set of lines
// (runs contiguous in global memory: rows of a row-major operand, columns of a
// column-major one) and each line is copied as it is. Copies are coalesced that way, and
// the fragment loads below read shared memory with the operand's own layout.
//
// Lines are padded by 16 bytes: consecutive lines then start in different memory banks,
// so a fragment load, which walks across lines, does not hit one bank over and over. A
// whole 16 bytes keeps the alignment that cooperative-matrix loads ask of their start and
// stride (16 bytes, or one matrix row where that is less) wherever unpadded lines had it.
const uint SHARED_PAD = 16 / AB_BYTES;

const uint A_LINE = A_COLUMN_MAJOR ? TILE_M : TILE_K;   // elements per line
const uint A_LINES = A_COLUMN_MAJOR ? TILE_K : TILE_M;
const uint A_STRIDE = A_LINE + SHARED_PAD;             // elements from line to line
const uint B_LINE = B_COLUMN_MAJOR ? TILE_K : TILE_N;
const uint B_LINES = B_COLUMN_MAJOR ? TILE_N : TILE_K;
const uint B_STRIDE = B_LINE + SHARED_PAD;

const int A_LAYOUT = A_COLUMN_MAJOR ? gl_CooperativeMatrixLayoutColumnMajor
                                    : gl_CooperativeMatrixLayoutRowMajor;
const int B_LAYOUT = B_COLUMN_MAJOR ? gl_CooperativeMatrixLayoutColumnMajor
                                    : gl_CooperativeMatrixLayoutRowMajor;

shared AB_TYPE A_shared[A_LINES * A_STRIDE];
shared AB_TYPE B_shared[B_LINES * B_STRIDE];

// Every invocation moves the same number of elements of each tile (the tile sizes are
// chosen so that this divides evenly); between two K steps they wait in registers.
const uint A_PER_INVOCATION = A_LINES * A_LINE / INVOCATIONS;
const uint B_PER_INVOCATION = B_LINES * B_LINE / INVOCATIONS;
AB_TYPE a_regs[A_PER_INVOCATION];
AB_TYPE b_regs[B_PER_INVOCATION];

// Edge tiles store each accumulator into this subgroup's slice of scratch first, since
// a cooperative-matrix store cannot stop at the edge of D.
shared D_TYPE scratch[NUM_SUBGROUPS * COOP_M * COOP_N];

// Set at the top of main().
uint m0, n0;                          // this workgroup's tile origin in D
uint a_base, b_base, c_base, d_base;  // this batch's offsets into A, B, C, D

// Where element (row, k) of A's tile lies in shared memory, and where element (row, k) of A
// lies in its buffer. B's functions take (k, col).
uint a_shared_offset(uint row, uint k) {
    return A_COLUMN_MAJOR ? k * A_STRIDE + row : row * A_STRIDE + k;
}
uint b_shared_offset(uint k, uint col) {
    return B_COLUMN_MAJOR ? col * B_STRIDE + k : k * B_STRIDE + col;
}
uint a_global_index(uint row, uint k) {
    return a_base + (A_COLUMN_MAJOR ? k * p.lda + row : row * p.lda + k);
}
uint b_global_index(uint k, uint col) {
    return b_base + (B_COLUMN_MAJOR ? col * p.ldb + k : k * p.ldb + col);
}

// The tile coordinates of the r-th element this invocation moves. Consecutive invocations
// take consecutive elements of a line, so a subgroup reads a contiguous run of memory.
uvec2 a_tile_coords(uint r) {  // (row, k)
    uint e = gl_LocalInvocationIndex + r * INVOCATIONS;
    uint line = e / A_LINE, pos = e % A_LINE;
    return A_COLUMN_MAJOR ? uvec2(pos, line) : uvec2(line, pos);
}
uvec2 b_tile_coords(uint r) {  // (k, col)
    uint e = gl_LocalInvocationIndex + r * INVOCATIONS;
    uint line = e / B_LINE, pos = e % B_LINE;
    return B_COLUMN_MAJOR ? uvec2(pos, line) : uvec2(line, pos);
}

// Registers <- the K step that starts at k0. Elements outside A or B (edge tiles, the part
// of the last K step past K, the look-ahead past the last step) become zero: the zeros add
// nothing to the products, so partial tiles need no special case in the multiply. The
// load itself stays unconditional and reads element 0, which every buffer has, so no
// invocation reads outside the matrix and the loads need no branch.
void prefetch(uint k0) {
    [[unroll]] for (uint r = 0; r < A_PER_INVOCATION; ++r) {
        uvec2 rk = a_tile_coords(r);
        uint row = m0 + rk.x, k = k0 + rk.y;
        bool inside = row < p.M && k < p.K;
        AB_TYPE value = A[inside ? a_global_index(row, k) : 0];
        a_regs[r] = inside ? value : AB_TYPE(0);
    }
    [[unroll]] for (uint r = 0; r < B_PER_INVOCATION; ++r) {
        uvec2 kc = b_tile_coords(r);
        uint k = k0 + kc.x, col = n0 + kc.y;
        bool inside = k < p.K && col < p.N;
        AB_TYPE value = B[inside ? b_global_index(k, col) : 0];
        b_regs[r] = inside ? value : AB_TYPE(0);
    }
}

void registers_to_shared() {
    [[unroll]] for (uint r = 0; r < A_PER_INVOCATION; ++r) {
        uvec2 rk = a_tile_coords(r);
        A_shared[a_shared_offset(rk.x, rk.y)] = a_regs[r];
    }
    [[unroll]] for (uint r = 0; r < B_PER_INVOCATION; ++r) {
        uvec2 kc = b_tile_coords(r);
        B_shared[b_shared_offset(kc.x, kc.y)] = b_regs[r];
    }
}

// A workgroup barrier that also makes shared-memory writes before it visible after it.
void workgroup_barrier() {
    controlBarrier(gl_ScopeWorkgroup, gl_ScopeWorkgroup, gl_StorageSemanticsShared,
                   gl_SemanticsAcquireRelease);
}

// factor * m, element by element. (SPIR-V's matrix-times-scalar is for float matrices
// only; multiplying by a matrix filled with the factor serves every type.)
MAT_ACC scaled(MAT_ACC m, D_TYPE factor) {
    return MAT_ACC(factor) * m;
}

void main() {
    m0 = gl_WorkGroupID.y * TILE_M;
    n0 = gl_WorkGroupID.x * TILE_N;
    uint batch = gl_WorkGroupID.z;
    a_base = batch * p.batch_stride_a;
    b_base = batch * p.batch_stride_b;
    c_base = batch * p.batch_stride_c;
    d_base = batch * p.batch_stride_d;

    // This subgroup's block inside the tile: subgroups are numbered along a row of the
    // subgroup grid first.
    uint sg_row = (gl_SubgroupID / SUBGROUPS_N) * SUBGROUP_ROWS;
    uint sg_col = (gl_SubgroupID % SUBGROUPS_N) * SUBGROUP_COLS;

    MAT_ACC acc[ACC_ROWS][ACC_COLS];
    [[unroll]] for (uint i = 0; i < ACC_ROWS; ++i) {
        [[unroll]] for (uint j = 0; j < ACC_COLS; ++j) {
            acc[i][j] = MAT_ACC(0);
        }
    }

    // ---- The K loop --------------------------------------------------------------------
    prefetch(0);
    for (uint k0 = 0; k0 < p.K; k0 += TILE_K) {
        workgroup_barrier();  // every subgroup has read the previous step's fragments
        registers_to_shared();
        workgroup_barrier();  // this step's tiles are in shared memory

        // Issued now, the next step's global loads are in flight while this step is
        // multiplied; their results are only needed at the top of the next iteration.
        prefetch(k0 + TILE_K);

        [[unroll]] for (uint kk = 0; kk < TILE_K; kk += COOP_K) {
            MAT_A a[ACC_ROWS];
            MAT_B b[ACC_COLS];
            [[unroll]] for (uint i = 0; i < ACC_ROWS; ++i) {
                coopMatLoad(a[i], A_shared, a_shared_offset(sg_row + i * COOP_M, kk), A_STRIDE,
                            A_LAYOUT);
            }
            [[unroll]] for (uint j = 0; j < ACC_COLS; ++j) {
                coopMatLoad(b[j], B_shared, b_shared_offset(kk, sg_col + j * COOP_N), B_STRIDE,
                            B_LAYOUT);
            }
            // Every A fragment meets every B fragment: ACC_ROWS + ACC_COLS loads feed
            // ACC_ROWS * ACC_COLS multiply-adds. (Integer signedness follows the types:
            // int8_t operands are sign-extended, uint8_t ones zero-extended.)
            [[unroll]] for (uint i = 0; i < ACC_ROWS; ++i) {
                [[unroll]] for (uint j = 0; j < ACC_COLS; ++j) {
                    acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
                }
            }
        }
    }

    // ---- The epilogue: D = alpha * acc + beta * C ---------------------------------------
    D_TYPE alpha = D_TYPE(p.alpha);
    D_TYPE beta = D_TYPE(p.beta);

    // The choice between the two paths is made per workgroup, not per accumulator, so
    // that the barriers of the edge path sit in control flow that the whole workgroup takes.
    bool interior = m0 + TILE_M <= p.M && n0 + TILE_N <= p.N
                    && (p.flags & FLAG_DIRECT_CD) != 0;
    if (interior) {
        // Whole accumulators go straight between registers and memory.
        [[unroll]] for (uint i = 0; i < ACC_ROWS; ++i) {
            [[unroll]] for (uint j = 0; j < ACC_COLS; ++j) {
                uint row = m0 + sg_row + i * COOP_M;
                uint col = n0 + sg_col + j * COOP_N;
                MAT_ACC result = scaled(acc[i][j], alpha);
#ifdef HAS_C
                MAT_ACC c;
                coopMatLoad(c, C, c_base + row * p.ldc + col, p.ldc,
                            gl_CooperativeMatrixLayoutRowMajor);
                result = result + scaled(c, beta);
#endif
                coopMatStore(result, D, d_base + row * p.ldd + col, p.ldd,
                             gl_CooperativeMatrixLayoutRowMajor);
            }
        }
    } else {
        // Each accumulator goes to this subgroup's scratch, from where every lane copies
        // the elements that fall inside D, one at a time.
        uint scratch_base = gl_SubgroupID * COOP_M * COOP_N;
        [[unroll]] for (uint i = 0; i < ACC_ROWS; ++i) {
            [[unroll]] for (uint j = 0; j < ACC_COLS; ++j) {
                coopMatStore(acc[i][j], scratch, scratch_base, COOP_N,
                             gl_CooperativeMatrixLayoutRowMajor);
                // Each subgroup reads only its own slice, so a subgroup barrier would do;
                // but lavapipe treats subgroup barriers as workgroup ones, which are only
                // safe where the whole workgroup arrives. It does arrive here (all of it
                // took this path), so a workgroup barrier says what really happens.
                workgroup_barrier();
                uint row0 = m0 + sg_row + i * COOP_M;
                uint col0 = n0 + sg_col + j * COOP_N;
                for (uint e = gl_SubgroupInvocationID; e < COOP_M * COOP_N;
                     e += gl_SubgroupSize) {
                    uint row = row0 + e / COOP_N, col = col0 + e % COOP_N;
                    if (row < p.M && col < p.N) {
                        D_TYPE value = scratch[scratch_base + e] * alpha;
#ifdef HAS_C
                        value = value + C[c_base + row * p.ldc + col] * beta;
#endif
                        D[d_base + row * p.ldd + col] = value;
                    }
                }
                workgroup_barrier();  // the scratch is free for the next accumulator
            }
        }
    }
}
