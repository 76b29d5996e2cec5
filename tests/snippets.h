/* snippets.h - the contexts in which the C blocks of README.md and docs/ compile as written.

   tests/run_snippets.sh turns each ```c block into one C file: the block's #include and #define
   lines first, then this header with SNIPPET_<context> defined (part 1: the names the block uses
   but does not declare, and SNIPPET_BEGIN), the block's other lines, SNIPPET_END, and this header
   again with SNIPPET_PART_2 (main). A block names its context in the comment line before it:
   <!-- snippet: CONTEXT -->. Contexts that run check what the block did: one_device (README) and
   llmc_cpu (docs/llmc.md's muon_setup) register llm.c's tensors, and every registration must
   start a tensor and give its shape (rows, cols, count, size) exactly, then the steps must move
   every tensor registered; gloo builds a config that muon_create accepts on 4 ranks. The others
   compile only (they need a GPU, a trainer's main or files). */
#ifndef SNIPPET_PART_2

#include <stdio.h>
#include <stdlib.h>
#define MUON_IMPLEMENTATION   /* a block that includes muon.h first has it already */
#include "muon.h"
#include "test.h"

#if defined(SNIPPET_one_device) || defined(SNIPPET_llmc_cpu)
/* llm.c's GPT-2 tensors (ParameterTensors' names, order and shapes), small: C channels, L layers,
   the vocabulary V padded to Vp, maxT positions. One flat buffer, as llm.c allocates it. */
#define SNIPPET_C 8
#define SNIPPET_L 2
#define SNIPPET_Vp 16
#define SNIPPET_maxT 4
#define SNIPPET_TENSORS(X, C, L, Vp, maxT) X(wte, Vp, C, 1) X(wpe, maxT, C, 1) X(ln1w, 1, C, L) X(ln1b, 1, C, L) \
  X(qkvw, 3 * C, C, L) X(qkvb, 1, 3 * C, L) X(attprojw, C, C, L) X(attprojb, 1, C, L) X(ln2w, 1, C, L) \
  X(ln2b, 1, C, L) X(fcw, 4 * C, C, L) X(fcb, 1, 4 * C, L) X(fcprojw, C, 4 * C, L) X(fcprojb, 1, C, L) \
  X(lnfw, 1, C, 1) X(lnfb, 1, C, 1)
#define SNIPPET_ALL(X) SNIPPET_TENSORS(X, SNIPPET_C, SNIPPET_L, SNIPPET_Vp, SNIPPET_maxT)
#define SNIPPET_FIELD(name, rows, cols, count) float *name;
typedef struct { SNIPPET_ALL(SNIPPET_FIELD) } snippet_tensors;   /* llm.c's ParameterTensors */
typedef struct { const char *name; int rows, cols, count; } snippet_shape;
#define SNIPPET_SHAPE(name, rows, cols, count) { #name, rows, cols, count },
static const snippet_shape snippet_shapes[] = { SNIPPET_ALL(SNIPPET_SHAPE) };
enum { SNIPPET_N = (int)(sizeof snippet_shapes / sizeof snippet_shapes[0]) };
static float *snippet_param[SNIPPET_N], *snippet_grad[SNIPPET_N];
static int snippet_step, snippet_registered[SNIPPET_N];

static void snippet_layout(float *flat, snippet_tensors *t, float **by_index) {
  size_t at = 0;
  int k = 0;
#define SNIPPET_PLACE(name, rows, cols, count) \
  by_index[k++] = t->name = flat + at; at += (size_t)(rows) * (cols) * (count);
  SNIPPET_ALL(SNIPPET_PLACE)
}
static size_t snippet_size(int k) { return (size_t)snippet_shapes[k].rows * snippet_shapes[k].cols * snippet_shapes[k].count; }
static size_t snippet_total(void) {
  size_t n = 0;
  int k;
  for (k = 0; k < SNIPPET_N; k++) n += snippet_size(k);
  return n;
}
static void snippet_backward(void) {   /* a fixed gradient per step and element of the flat buffer */
  size_t i, n = snippet_total();
  snippet_step++;
  for (i = 0; i < n; i++) snippet_grad[0][i] = (float)((i * 7 + (size_t)snippet_step * 3) % 11) / 11.0f - 0.5f;
}

/* Which tensor a pointer starts, or -1; a name, where given, must be the tensor's. */
static int snippet_tensor(const void *param, const void *grad, const char *name) {
  int k;
  for (k = 0; k < SNIPPET_N; k++)
    if (param == (const void *)snippet_param[k]) {
      CHECK(grad == (const void *)snippet_grad[k], "%s: the gradient is not grads.%s", snippet_shapes[k].name,
            snippet_shapes[k].name);
      CHECK(!name || strcmp(name, snippet_shapes[k].name) == 0, "params.%s registered under the name '%s'",
            snippet_shapes[k].name, name);
      return k;
    }
  CHECK(0, "'%s': its param is not the start of one of llm.c's tensors", name ? name : "(null)");
  return -1;
}
static muon_status snippet_add_matrix(muon_optimizer *o, const muon_matrix *m, int *index) {
  int k = snippet_tensor(m->param, m->grad, m->name);
  if (k >= 0) {
    const snippet_shape *s = &snippet_shapes[k];
    snippet_registered[k]++;
    CHECK(m->rows == s->rows && m->cols == s->cols && (m->count > 1 ? m->count : 1) == s->count,
          "%s registered as %d x %d, count %d: llm.c's is [%d, %d, %d]", s->name, m->rows, m->cols, m->count,
          s->count, s->rows, s->cols);
  }
  return (muon_add_matrix)(o, m, index);
}
static muon_status snippet_add_adamw_param(muon_optimizer *o, const muon_adamw_param *a, int *index) {
  int k = snippet_tensor(a->param, a->grad, a->name);
  if (k >= 0) {
    const snippet_shape *s = &snippet_shapes[k];
    int count = a->count > 1 ? a->count : 1;
    snippet_registered[k]++;
    CHECK(count == s->count && a->size * (size_t)count == snippet_size(k),
          "%s registered as %d pieces of %zu elements: llm.c's is %d of %zu", s->name, count, a->size, s->count,
          snippet_size(k) / (size_t)s->count);
  }
  return (muon_add_adamw_param)(o, a, index);
}
#define muon_add_matrix(o, m, i) snippet_add_matrix(o, m, i)
#define muon_add_adamw_param(o, a, i) snippet_add_adamw_param(o, a, i)

/* What a registration did: every tensor at most once, each registered one updated. */
static void snippet_check_updates(const float *p, const float *p0) {
  size_t i, moved = 0;
  int k, twice = 0;
  for (k = 0; k < SNIPPET_N; k++) twice += snippet_registered[k] > 1;
  CHECK(twice == 0, "a tensor registered twice");
  for (k = 0; k < SNIPPET_N; k++)
    if (snippet_registered[k]) {
      size_t at = (size_t)(snippet_param[k] - p), changed = 0;
      for (i = at; i < at + snippet_size(k); i++) changed += p[i] != p0[i];
      CHECK(changed > 0, "%s registered but never updated", snippet_shapes[k].name);
      moved += changed;
    }
  CHECK(moved > 0, "nothing was registered");
}

#if defined(SNIPPET_one_device)
enum { C = SNIPPET_C, L = SNIPPET_L, Vp = SNIPPET_Vp };
static snippet_tensors params, grads;
static int steps = 3;
static void forward_backward(void) { snippet_backward(); }
static float lr_schedule(int step) { return 0.02f / (float)(1 + step); }
#define SNIPPET_BEGIN static int snippet(void) {
#define SNIPPET_END return 0; }
#else
/* llm.c's GPT2, the fields a trainer's muon code reads */
#define NUM_PARAMETER_TENSORS 16
typedef struct { int max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels; } GPT2Config;
typedef struct {
  GPT2Config config;
  snippet_tensors params, grads;
  size_t param_sizes[NUM_PARAMETER_TENSORS], num_parameters;
  float *params_memory, *grads_memory;
} GPT2;
#define SNIPPET_BEGIN
#define SNIPPET_END
#endif

#elif defined(SNIPPET_gloo)
/* A block that continues the one-device one: desc exists; the mesh is 2 x 2 at 4 ranks. */
static muon_desc desc;
static const int tp_dims[2] = { 0, 1 };
#define SNIPPET_BEGIN static int snippet(void) { desc = muon_default_desc();
#define SNIPPET_END { muon_optimizer *o_ = NULL; muon_status s_ = muon_create(&o_, &desc); \
  CHECK(s_ == MUON_OK, "muon_create with the block's config: %s", muon_error(NULL)); muon_destroy(o_); } return 0; }

#elif defined(SNIPPET_partial)   /* compiled only */
static muon_comm world;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END (void)cfg; }

#elif defined(SNIPPET_cpu)       /* compiled only */
static muon_desc desc;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END }

#elif defined(SNIPPET_state)     /* compiled only */
static muon_optimizer *opt;
static int resume, steps, every = 100;
static const char *path = "ckpt/muon.bin";
static void forward_backward(void) {}
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END }

#elif defined(SNIPPET_mpi)      /* compiled only, with Open MPI's headers */
#include "muon_mpi.h"
static muon_desc desc;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END (void)desc; }

#elif defined(SNIPPET_cuda) || defined(SNIPPET_nccl)   /* compiled only, with the CUDA headers */
#include <cuda_runtime.h>
#include <nccl.h>
#include "muon_cuda.h"
#include "muon_nccl.h"
static muon_optimizer *opt;
static cudaStream_t my_stream, main_stream, nccl_stream;
static ncclComm_t nccl_comm;
static int local_rank;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END (void)desc; }   /* the block elides muon_create */

#elif defined(SNIPPET_llmc_cpu_main)   /* compiled only: train_gpt2.c's main, what muon adds */
typedef struct { float *params_memory; size_t num_parameters; } GPT2;
muon_optimizer *muon_setup(GPT2 *model, int resume);
#define freadCheck(p, size, n, f) ((void)fread(p, size, n, f))
#define fwriteCheck(p, size, n, f) ((void)fwrite(p, size, n, f))
#define fopenCheck(path, mode) fopen(path, mode)
#define fcloseCheck(f) ((void)fclose(f))
static GPT2 model;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END }

#elif defined(SNIPPET_llmc_clip) || defined(SNIPPET_llmc_clip_step)   /* compiled only: docs/muonclip.md */
#include <math.h>
typedef struct { int num_layers, num_heads, channels; } GPT2Config;
typedef struct { float *preatt; } ActivationTensors;   /* (L, B, NH, T, T) */
typedef struct { GPT2Config config; ActivationTensors acts; } GPT2;
void gpt2_head_max_logits(GPT2 *model, int B, int T, float *max_logits);
#if defined(SNIPPET_llmc_clip)
#define SNIPPET_BEGIN
#define SNIPPET_END
static void (*snippet)(GPT2 *, int, int, float *) = gpt2_head_max_logits;
#else
static GPT2 model;
static int B, T;
static muon_optimizer *opt;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END }
#endif

#elif defined(SNIPPET_llmc_threads)    /* compiled only, with -fopenmp */
#include <omp.h>
#define SNIPPET_BEGIN
#define SNIPPET_END

#elif defined(SNIPPET_llmc_gpu) || defined(SNIPPET_llmc_gpu_main)
/* compiled only, by nvcc as CUDA C++ with llm.c's flags: llm.c's names the blocks use (declared here
   as llm.c defines them in train_gpt2.cu and llmc/, not copied) */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <nccl.h>
#include "muon_cuda.h"
#include "muon_nccl.h"
typedef __nv_bfloat16 floatX;
#define ncclFloatX ncclBfloat16
#define NUM_PARAMETER_TENSORS 16
#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define ncclCheck(call) ((void)(call))
typedef struct { ptrdiff_t offset; size_t size; } ShardInfo;
typedef struct { int process_rank, num_processes, zero_stage; ncclComm_t nccl_comm; } MultiGpuConfig;
typedef struct { int max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels; } GPT2Config;
typedef struct { GPT2Config config; void *params_memory, *grads_memory; float *master_weights; } GPT2;
static MultiGpuConfig multi_gpu_config;
static cudaStream_t main_stream;
ShardInfo gpt2_get_tensor_at_layer(const GPT2 *model, int layer_id, int param_tensor_id);
ShardInfo multi_gpu_get_shard_offset(size_t elements, const MultiGpuConfig *config, int shard_at_stage);
template <class Td, class Ts>
__global__ void copy_and_cast_kernel(Td *dst, const Ts *src, size_t n, ptrdiff_t stride_dst, ptrdiff_t stride_src) {
  (void)dst; (void)src; (void)n; (void)stride_dst; (void)stride_src;
}
#if defined(SNIPPET_llmc_gpu)
#define SNIPPET_BEGIN
#define SNIPPET_END
#else
extern muon_optimizer *muon_opt;
muon_optimizer *muon_setup(GPT2 *model, float weight_decay);
static GPT2 model;
static char filename_buffer[512];
static const char *output_log_dir = "log";
static int step, rank, resuming, resume_max_step;
static float weight_decay, learning_rate = 3e-4f, step_learning_rate, grad_scale = 1;
#define SNIPPET_BEGIN static void snippet(void) {
#define SNIPPET_END }
#endif

#else
#error "tests/snippets.h: unknown snippet context"
#endif

#else /* SNIPPET_PART_2 */

#if defined(SNIPPET_one_device)
int main(void) {
  float *p = (float *)calloc(snippet_total(), sizeof(float)), *g = (float *)calloc(snippet_total(), sizeof(float));
  float *p0 = (float *)calloc(snippet_total(), sizeof(float));
  size_t i;
  TEST_CASE("the block registers llm.c's tensors with their exact shapes and trains");
  snippet_layout(p, &params, snippet_param);
  snippet_layout(g, &grads, snippet_grad);
  for (i = 0; i < snippet_total(); i++) p0[i] = p[i] = (float)(i % 13) / 13.0f - 0.4f;
  CHECK(snippet() == 0, "the block returned non-zero");
  CHECK(snippet_step == steps, "%d backward passes for %d steps", snippet_step, steps);
  snippet_check_updates(p, p0);
  free(p); free(g); free(p0);
  return test_summary();
}
#elif defined(SNIPPET_llmc_cpu)
int main(void) {   /* the block's muon_setup on llm.c's GPT2, then 3 steps */
  GPT2 model;
  float *p0;
  muon_optimizer *opt;
  size_t i;
  int k, s;
  TEST_CASE("muon_setup registers llm.c's 16 tensors with their exact shapes, and muon_step trains them");
  memset(&model, 0, sizeof model);
  model.config.channels = SNIPPET_C; model.config.num_layers = SNIPPET_L;
  model.config.padded_vocab_size = SNIPPET_Vp; model.config.vocab_size = SNIPPET_Vp - 3;
  model.config.max_seq_len = SNIPPET_maxT; model.config.num_heads = 2;
  for (k = 0; k < SNIPPET_N; k++) model.param_sizes[k] = snippet_size(k);
  model.num_parameters = snippet_total();
  model.params_memory = (float *)calloc(model.num_parameters, sizeof(float));
  model.grads_memory = (float *)calloc(model.num_parameters, sizeof(float));
  p0 = (float *)calloc(model.num_parameters, sizeof(float));
  snippet_layout(model.params_memory, &model.params, snippet_param);
  snippet_layout(model.grads_memory, &model.grads, snippet_grad);
  for (i = 0; i < model.num_parameters; i++) p0[i] = model.params_memory[i] = (float)(i % 13) / 13.0f - 0.4f;
  opt = muon_setup(&model, 0);
  for (k = 0; k < SNIPPET_N; k++)
    CHECK(snippet_registered[k] == 1, "%s registered %d times", snippet_shapes[k].name, snippet_registered[k]);
  for (s = 0; s < 3; s++) {
    snippet_backward();
    CHECK(muon_step(opt) == MUON_OK, "step %d: %s", s, muon_error(opt));
  }
  snippet_check_updates(model.params_memory, p0);
  muon_destroy(opt);
  free(model.params_memory); free(model.grads_memory); free(p0);
  return test_summary();
}
#elif defined(SNIPPET_gloo)
int main(void) {
  TEST_CASE("the block's mesh and config: muon_create accepts them on every rank");
  snippet();
  return test_summary();
}
#elif defined(SNIPPET_llmc_gpu)
int main(void) { (void)test__fail; return 0; }
#elif defined(SNIPPET_llmc_threads)
int main(void) { muon_desc d = muon_default_desc(); muon_use_omp(&d); return d.compute == &cpu ? 0 : 1; }
#else
int main(void) { (void)snippet; (void)test__fail; return 0; }
#endif

#endif /* SNIPPET_PART_2 */
