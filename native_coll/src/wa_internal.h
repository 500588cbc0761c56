/* Internal structures shared by the engine's C files. Not part of the public contract (wa.h).
 * Every function declared here is prefixed wai_ and hidden from other libraries (CMakeLists.txt).
 * The files depend in one direction: the engine's files (engine.h) -> {coll.c, progress.c,
 * exit_report.c, buffer_pool.c, groups.c}; coll.c -> {node_layout.c, the schedules schedule.c and
 * schedule_hier.c (through their tables of operations, chosen once per collective)} ->
 * schedule_parts.c. None of them calls back into its caller except through the one callback or
 * table it was handed (progress, exit report, schedule). struct wa_engine lives in engine.h, which
 * only the engine's own files include. */
#ifndef NATIVE_COLL_WA_INTERNAL_H
#define NATIVE_COLL_WA_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "wa.h"

/* ---- buffer_pool.c: reference-counted float buffers, recycled to avoid page faults per call ---- */
typedef struct wa_buf {
  float *data;
  int refs;
  struct wa_buf *next;
} wa_buf;

typedef struct wa_pool {
  size_t cap; /* floats per buffer */
  wa_buf *free_list;
  int free_count;
  int max_free;
  pthread_mutex_t mu;
} wa_pool;

int wai_pool_init(wa_pool *p, size_t cap, int max_free);
wa_buf *wai_pool_get(wa_pool *p);            /* refs = 1, contents undefined; NULL when out of memory */
wa_buf *wai_buf_ref(wa_buf *b);              /* +1 reference */
void wai_buf_unref(wa_pool *p, wa_buf *b);   /* -1 reference; back to the pool at 0; NULL is a no-op */
void wai_pool_destroy(wa_pool *p);

/* ---- progress.c: the progress thread, a generic loop around one poll callback ---- */
enum { WAI_POLL_IDLE = 0, WAI_POLL_PROGRESSED = 1, WAI_POLL_FINISHED = 2 };
/* Called with the mutex held; sets *inflight to the bytes of transfers under way (the thread
 * polls without sleeping while they may complete) and returns a WAI_POLL_* value. */
typedef int (*wai_poll_fn)(void *ctx, size_t *inflight);

double wai_now(void); /* CLOCK_MONOTONIC seconds */

typedef struct wai_progress {
  pthread_t thread;
  pthread_mutex_t *mu;  /* held while poll runs; released while the thread sleeps */
  pthread_cond_t *wake; /* signalled by the application to cut a sleep short */
  wai_poll_fn poll;
  void *ctx;
  int stop, running;
} wai_progress;

int wai_progress_start(wai_progress *p, pthread_mutex_t *mu, pthread_cond_t *wake,
                       wai_poll_fn poll, void *ctx);
void wai_progress_stop(wai_progress *p); /* mu not held; joins the thread */

/* ---- the error slot: how every internal function reports a failure ---- */
/* A failing function fills the caller's slot and returns its code: one channel, which no caller
 * can ignore in favour of a flag. What a failure means is decided by the engine alone, which turns
 * it into its broken state in one place (wai_engine_break, failure.c). */
typedef struct wai_err {
  int code;      /* the WA_E* code the function returned */
  int peer;      /* the rank at the other end of the failed MPI call; -1 when MPI does not say */
  char msg[512];
} wai_err;

static inline int wai_err_set(wai_err *err, int code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int wai_err_set(wai_err *err, int code, int peer, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  err->code = code;
  err->peer = peer;
  return code;
}

/* An MPI call whose failure names `peer` (-1: none) in the slot and returns WA_EMPI. */
#define WAI_CHECK_MPI(err, peer, call)                                                   \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != MPI_SUCCESS) {                                                            \
      char s_[MPI_MAX_ERROR_STRING] = "";                                                \
      int l_ = 0;                                                                        \
      (void)MPI_Error_string(rc_, s_, &l_); /* on failure s_ stays empty */              \
      return wai_err_set((err), WA_EMPI, (peer), "%s failed: %s", #call, s_);            \
    }                                                                                    \
  } while (0)

/* ---- the wire: what a collective's schedule needs of the engine, one message layout and one
 * tag set for every MPI message ---- */
/* Owned by the engine and handed to every collective and schedule function, so they never see the
 * engine itself (engine -> collective -> schedule, never back). */
typedef struct wai_wire {
  MPI_Comm comm;      /* the engine's private duplicate */
  int rank;           /* in comm */
  size_t n;           /* floats in the buffer */
  int64_t tag_window; /* iterations whose tags are distinct (MPI_TAG_UB) */
  wa_pool *pool;      /* results, snapshots and gather space */
  const int *node_of; /* per rank: its node (equal values share one); NULL: every collective flat */
  size_t hier_min;    /* the node-aware schedule runs for buffers of at least this many floats */
  int nonfinite_guard; /* 1 (wa_set_nonfinite_guard): schedules mark result chunks holding NaN or
                          inf, and the engine refuses such results */
  int global_precision;    /* WA_PRECISION_* of global iterations (wa_set_global_precision) */
  const float *global_base; /* B, the caller's last global model, when that is not FP32 */
  struct wai_layout_cache *layouts; /* the node layouts of member sets (node_layout.c), the engine's */
} wai_wire;

enum { MSG_ACT = 1, MSG_FIN = 2 };

/* A control message (tag WAI_TAG_CTRL): ACT = "I take part in iteration t with a contribution
 * that is fresh (or not) and was published for iteration version"; FIN = "I close after t". */
typedef struct wa_msg {
  int64_t kind; /* MSG_ACT or MSG_FIN */
  int64_t t;
  int64_t fresh;
  int64_t version;
} wa_msg;
#define WAI_MSG_WORDS 4 /* sent as WAI_MSG_WORDS MPI_INT64_T */

/* Tags on the engine's private communicator: control 0; iteration t's data and result chunks
 * 1 + 2 (t mod window) and 2 + 2 (t mod window); the collectives of synchronize(), which the engine
 * numbers with negative t (engine.h), the two tags above them all (<= MPI_TAG_UB). */
#define WAI_TAG_CTRL 0
#define wai_tag_data(w, t) \
  ((int)((t) < 0 ? 2 * (w)->tag_window + 1 : 1 + 2 * ((t) % (w)->tag_window)))
#define wai_tag_res(w, t) \
  ((int)((t) < 0 ? 2 * (w)->tag_window + 2 : 2 + 2 * ((t) % (w)->tag_window)))

/* ---- the non-finite guard, shared by every schedule and the engine's own loops over buf ---- */
/* Floats per cache-sized block of a reduction. */
enum { WAI_BLOCK = 2048 };

/* The guard's test of one float, for the loop that computes it: OR the values over the loop, and
 * bit 31 of the OR (wai_nonfinite_seen) is set iff one of the floats was NaN or +-inf. Integer
 * operations on the bits (with the sign cleared, a float is not finite iff it is >= 0x7f800000,
 * i.e. iff adding 0x00800000 sets bit 31), so the loop still vectorises, no float arithmetic is
 * reordered (results keep their bits), and the test costs next to nothing beside the loop's own
 * arithmetic; a separate pass over a block would cost a load per float more. */
static inline uint32_t wai_nonfinite_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (u & 0x7fffffffu) + 0x00800000u;
}

static inline int wai_nonfinite_seen(uint32_t ored) { return (int)(ored >> 31); }

/* 1 when one of the m floats is NaN or +-inf, else 0 (a pass of its own: for the rare path). */
static inline int wai_block_nonfinite(const float *d, size_t m) {
  uint32_t ored = 0;
  for (size_t i = 0; i < m; i++) ored |= wai_nonfinite_bits(d[i]);
  return wai_nonfinite_seen(ored);
}

/* ---- precision.c: the 16-bit wire of global iterations (wa_set_global_precision) ---- */
/* Round-to-nearest-even float32 -> bfloat16 / IEEE binary16 and back, on the bits (no float16
 * type, no library call, no dependence on the CPU's conversion instructions); NaN stays NaN,
 * overflow gives inf. Loops over a block, the precision hoisted out of them. */
static inline uint16_t wai_bf16_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float wai_bf16_to(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* F. Giesen's float_to_half_fast3_rtne / half_to_float (public domain), on uint32 bits. */
static inline uint16_t wai_fp16_of(float x) {
  const uint32_t f32_inf = 255u << 23, f16_max = (127u + 16u) << 23;
  const uint32_t magic_u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t o;
  if (u >= f16_max) {
    o = u > f32_inf ? 0x7e00u : 0x7c00u; /* NaN -> quiet NaN; 65536 and beyond -> inf */
  } else if (u < (113u << 23)) {         /* subnormal or zero: the FPU's round-to-nearest-even */
    float f, magic;
    memcpy(&f, &u, sizeof f);
    memcpy(&magic, &magic_u, sizeof magic);
    f += magic;
    memcpy(&u, &f, sizeof u);
    o = (uint16_t)(u - magic_u);
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u -= (127u - 15u) << 23;
    u += 0xfffu + odd;
    o = (uint16_t)(u >> 13); /* a carry into the exponent past 30 gives 0x7c00: inf */
  }
  return (uint16_t)(o | (sign >> 16));
}

static inline float wai_fp16_to(uint16_t h) {
  const uint32_t shifted_exp = 0x7c00u << 13, magic_u = 113u << 23;
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23; /* inf, NaN */
  } else if (exp == 0) {     /* zero, subnormal: renormalise */
    float f, magic;
    o += 1u << 23;
    memcpy(&f, &o, sizeof f);
    memcpy(&magic, &magic_u, sizeof magic);
    f -= magic;
    memcpy(&o, &f, sizeof o);
  }
  o |= ((uint32_t)h & 0x8000u) << 16;
  float x;
  memcpy(&x, &o, sizeof x);
  return x;
}

/* dst[i] = round16(x[i] - base[i]) for i < n; 1 when one of them is NaN or inf (in 16 bits). */
int wai_encode_delta16(int prec, uint16_t *restrict dst, const float *restrict x,
                       const float *restrict base, size_t n);
/* acc[i] = decode(src[i]) (first) or acc[i] += decode(src[i]). */
void wai_sum16(int prec, float *restrict acc, const uint16_t *restrict src, size_t n, int first);
/* dst[i] = round16(acc[i] / div): the mean, rounded once. */
void wai_mean16(int prec, uint16_t *restrict dst, const float *restrict acc, size_t n, float div);
/* dst[i] = base[i] + decode(mean[i]); 1 when one of them is NaN or inf. */
int wai_apply16(int prec, float *restrict dst, const float *restrict base,
                const uint16_t *restrict mean, size_t n);

/* ---- node_layout.c: the node layout of a member set, computed once per set ---- */
/* Which node each member is on (nodes ordered by their lowest member), its place there, and the
 * node-aware schedule's grid; shared by the collectives of the set (refs) and cached per engine. */
typedef struct wai_layout {
  int refs;       /* the cache's and each collective's */
  int S;
  int *members;   /* the set (S sorted ranks): the cache's key */
  int N, p;       /* nodes, members on each; N = 0: not N >= 2 nodes of p >= 2 alike (no grid) */
  int *node_idx, *local_idx; /* per member: its node's index, its index on that node */
  int *grid;      /* N * p: grid[a * p + l] = member index of the l-th member on node a */
} wai_layout;

enum { WAI_LAYOUT_SLOTS = 32 }; /* distinct member sets kept (the butterfly has <= 31 per rank) */
typedef struct wai_layout_cache {
  wai_layout *slot[WAI_LAYOUT_SLOTS];
  int next;         /* the slot the next new set takes (round robin) */
  int64_t computed; /* layouts computed so far (wa_layouts_computed, for tests) */
} wai_layout_cache;

/* The layout of the member set (a new reference; computed and cached when the set is not cached). */
int wai_layout_get(wai_layout_cache *cache, const int *node_of, const int *members, int S,
                   wai_layout **out, wai_err *err);
void wai_layout_unref(wai_layout *l); /* NULL is a no-op */
void wai_layout_cache_clear(wai_layout_cache *cache); /* the engine's: drops the cache's references */

/* ---- coll.c: one collective, a non-blocking state machine run by one of two schedules ---- */
enum { STAGE_IDLE = 0, STAGE_DATA = 1, STAGE_RESULT = 2, STAGE_DONE = 3 };
/* The node-aware schedule's steps inside STAGE_DATA (schedule_hier.c). */
enum { HIER_LOCAL = 0, HIER_CROSS = 1, HIER_CROSS_RES = 2 };

struct wa_req; /* engine.h: the application call */
struct wai_sched_ops;

typedef struct wa_coll {
  int64_t t;
  int is_global;
  int S;          /* members */
  int me;         /* my index in members */
  int *members;   /* sorted ranks */
  int *indices;   /* S: MPI_Testsome's output */
  MPI_Status *statuses; /* S: MPI_Testsome's output (which request failed) */
  unsigned char *pend;  /* S: the requests of the set under test that were open before it */
  int stage;
  int data_k, res_k;       /* next send step (1..S-1) of each phase; S once all are posted */
  int acts;                /* ACT messages received (S - 1 expected) */
  unsigned char *act_from; /* per member */
  unsigned char *fresh;    /* per member, valid once its ACT arrived (mine at start) */
  int64_t *version;        /* per member: iteration its contribution was published for */
  const float *contrib;    /* my contribution (app buf when fresh, else contrib_snap->data) */
  wa_buf *contrib_snap;
  wa_buf *result;
  wa_buf *gather;          /* other members' pieces of my chunk, member-indexed slots */
  wa_msg act_msg;          /* payload of my ACT sends, alive until they complete */
  MPI_Request *rq;         /* 5 * S: data recv, result recv, data send, result send, act send */
  const struct wai_sched_ops *ops; /* the schedule, chosen once by wai_coll_new */
  /* The node-aware schedule (schedule_hier.c); N = 0 and layout NULL for the direct one. */
  wai_layout *layout;      /* the member set's (a reference); the pointers below point into it */
  int N, p;                /* nodes the members are on, members per node (the same on each) */
  int my_node, my_local;   /* my node's index (nodes ordered by their lowest member) and mine on it */
  const int *node_idx, *local_idx; /* per member */
  const int *grid;         /* N * p: grid[a * p + l] = member index of the l-th member on node a */
  int phase;               /* HIER_* while stage is STAGE_DATA */
  wa_buf *part;            /* my node's partial sums of my slice, then the other nodes' pieces */
  /* A global iteration on the 16-bit wire (wa_set_global_precision): lowp is its WA_PRECISION_*,
   * 0 for float32. pack holds 2 n uint16: my encoded deltas [0, n), then the 16-bit mean of every
   * chunk [n, 2n) (mine reduced here, the others received); gather's pieces are uint16 too. */
  int lowp;
  int own_bad;             /* lowp: my encoded delta held NaN or inf */
  wa_buf *pack;
  int64_t bytes_sent;      /* data and result bytes handed to MPI_Isend */
  struct wa_req *app;      /* the application call waiting on this collective, if any (engine.h) */
  struct wa_coll *next;    /* the engine's lists (activation.c) */
} wa_coll;

/* Each returns WA_OK or a WA_E* code with err filled. wai_coll_new copies members (S sorted
 * ranks, this rank among them): which ranks take part is the engine's decision (groups.c); which
 * schedule runs them is decided there, once (coll.c). */
int wai_coll_new(const wai_wire *w, int64_t t, int is_global, const int *members, int S,
                 wa_coll **out, wai_err *err);
int wai_coll_start(const wai_wire *w, wa_coll *c, const float *contrib, wa_buf *snap, int fresh,
                   int64_t version, wai_err *err); /* c owns snap from here on, even on failure */
int wai_coll_advance(const wai_wire *w, wa_coll *c, int *progressed, wai_err *err);
/* A complete collective's result holds NaN or inf (1) or not (0). The owner of each result chunk
 * sets the chunk's first element to NaN when a block of it is not finite (w->nonfinite_guard), so
 * this reads one float per chunk. */
int wai_coll_poisoned(const wai_wire *w, const wa_coll *c);
/* Whether this rank's own contribution to c held NaN or inf (the rare path: a pass over it),
 * or on the 16-bit wire, whether its encoded delta did (fp16 overflow included). */
int wai_coll_own_nonfinite(const wai_wire *w, const wa_coll *c);

int wai_coll_member_index(const wa_coll *c, int rank);
void wai_coll_free(const wai_wire *w, wa_coll *c);
void wai_coll_abandon(wa_coll *c); /* error path: cancel receives, leak in-flight memory */
/* ulfm.c: let go of a pending request on the error path or at teardown (recv: cancel it first);
 * its code is not reported. Freed, except with ULFM, where it is left unfreed (see ulfm.c). */
void wai_drop_request(MPI_Request *rq, int recv);
int wai_coll_missing(const wa_coll *c, int *out); /* ranks that have not answered */
size_t wai_coll_bytes(const wai_wire *w, const wa_coll *c);

/* ---- schedule.c, schedule_hier.c: the two schedules, each one table of operations ---- */
/* coll.c calls a schedule only through its table, the schedules never call coll.c. start: my
 * sends and receives posted (contrib, snap, result and act_msg set by coll.c); advance: test what
 * is in flight, move on; missing: the ranks that have not answered (no MPI call, no lock: the exit
 * report runs it); poisoned: the guard's NaN marks in a complete result. */
typedef struct wai_sched_ops {
  int (*start)(const wai_wire *w, wa_coll *c, wai_err *err);
  int (*advance)(const wai_wire *w, wa_coll *c, int *progressed, wai_err *err);
  int (*missing)(const wa_coll *c, int *out);
  int (*poisoned)(const wai_wire *w, const wa_coll *c);
} wai_sched_ops;
extern const wai_sched_ops wai_sched_flat; /* schedule.c: direct reduce-scatter + allgather */
extern const wai_sched_ops wai_sched_hier; /* schedule_hier.c: node-aware */

/* ---- schedule_parts.c: what both schedules are built from ---- */
/* Chunk k of n floats split S ways (the first n mod S chunks one float longer), and MPI_Testsome
 * over one request set (done = every request of it). */
void wai_chunk_of(size_t n, int S, int k, size_t *off, size_t *len);
int wai_coll_test_set(wa_coll *c, int set, int *all_done, wai_err *err);
int wai_coll_send_acts(const wai_wire *w, wa_coll *c, wai_err *err); /* c->act_msg to every member */
enum { RQ_DATA_RECV = 0, RQ_RES_RECV = 1, RQ_DATA_SEND = 2, RQ_RES_SEND = 3, RQ_ACT_SEND = 4 };
static inline MPI_Request *wai_rq_set(wa_coll *c, int set) { return c->rq + (size_t)set * c->S; }

/* ---- exit_report.c: names the missing peers when the process exits inside MPI ---- */
/* An entry the engine embeds; its report callback runs from an atexit hook, must make no MPI call
 * and take no lock (the exiting thread may hold any), and prints with wai_exit_report_line. */
typedef struct wai_exit_entry {
  void (*report)(void *ctx);
  void *ctx;
  struct wai_exit_entry *next;
} wai_exit_entry;

void wai_exit_report_register(wai_exit_entry *entry);
void wai_exit_report_unregister(wai_exit_entry *entry);
/* One line to stderr: rank `rank` is exiting while collective `what` ("global iteration 5") is in
 * flight, `missing` had not delivered. where: per rank "host H, pid P" (wa_describe_ranks) or NULL. */
void wai_exit_report_line(int rank, const char *const *where, const char *what,
                          const int *missing, int n_missing);

#endif
