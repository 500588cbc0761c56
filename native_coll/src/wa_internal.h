/* Internal structures shared by the engine's C files. Not part of the public contract (wa.h).
 * Every function declared here is prefixed wai_ and hidden from other libraries (CMakeLists.txt). */
#ifndef NATIVE_COLL_WA_INTERNAL_H
#define NATIVE_COLL_WA_INTERNAL_H

#include <pthread.h>

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

/* ---- the wire: one control message layout and one tag set for every MPI message ---- */
enum { MSG_ACT = 1, MSG_FIN = 2 };

/* A control message (tag WA_TAG_CTRL): ACT = "I take part in iteration t with a contribution
 * that is fresh (or not) and was published for iteration version"; FIN = "I close after t". */
typedef struct wa_msg {
  int64_t kind; /* MSG_ACT or MSG_FIN */
  int64_t t;
  int64_t fresh;
  int64_t version;
} wa_msg;
#define WA_MSG_WORDS 4 /* sent as WA_MSG_WORDS MPI_INT64_T */

/* Tags on the engine's private communicator: control 0; iteration t's data and result chunks
 * 1 + 2 (t mod window) and 2 + 2 (t mod window); synchronize() above them all. */
#define WA_TAG_CTRL 0
#define wai_tag_data(e, t) ((int)(1 + 2 * ((t) % (e)->tag_window)))
#define wai_tag_res(e, t) ((int)(2 + 2 * ((t) % (e)->tag_window)))
#define wai_tag_sync(e) ((int)(2 * (e)->tag_window + 1))

/* ---- schedule.c: one collective, a non-blocking state machine ---- */
enum { STAGE_IDLE = 0, STAGE_DATA = 1, STAGE_RESULT = 2, STAGE_DONE = 3 };

struct wa_req;

typedef struct wa_coll {
  int64_t t;
  int is_global;
  int S;          /* members */
  int me;         /* my index in members */
  int *members;   /* sorted ranks */
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
  struct wa_req *app;      /* the application call waiting on this collective, if any */
  struct wa_coll *next;
} wa_coll;

wa_coll *wai_coll_new(wa_engine *e, int64_t t);
int wai_coll_member_index(const wa_coll *c, int rank);
int wai_coll_start(wa_engine *e, wa_coll *c, const float *contrib, wa_buf *snap, int fresh,
               int64_t version);
int wai_coll_advance(wa_engine *e, wa_coll *c, int *progressed);
void wai_coll_free(wa_engine *e, wa_coll *c);
void wai_coll_abandon(wa_engine *e, wa_coll *c); /* error path: cancel receives, leak in-flight memory */
int wai_coll_missing(const wa_coll *c, int *out); /* ranks that have not answered */
size_t wai_coll_bytes(const wa_engine *e, const wa_coll *c);
void wai_chunk_of(size_t n, int S, int k, size_t *off, size_t *len);

/* ---- engine.c: application requests and results ---- */
enum { REQ_ALLREDUCE = 1, REQ_CLOSE = 2, REQ_SETTLE = 3 };

typedef struct wa_req {
  int kind;
  int64_t t;
  int late; /* WA_LATE_* */
  int reset;
  int taken;
  int done;
  int status;
  int64_t applied_global; /* WA_GLOBAL_OVERLAP: the global average this call applied, else -1 */
  int64_t global_lag;
} wa_req;

struct wa_engine {
  MPI_Comm comm;
  int rank, P, S;
  int64_t tau;
  int global_mode; /* WA_GLOBAL_* */
  double timeout;
  float *buf;
  size_t n;
  int64_t tag_window;
  wa_pool pool;

  pthread_mutex_t mu;
  pthread_cond_t wake; /* engine thread sleeps here */
  pthread_cond_t done; /* application thread waits here */
  wai_progress progress;
  int closing, closed, broken;
  char err[512];
  int peer;               /* the peer of the last MPI call the schedule made (-1: none) */
  char **where;           /* per rank "host H, pid P" (wa_describe_ranks), for messages */
  struct wa_engine *next_live; /* exit_report.c's registry of engines not yet destroyed */

  wa_msg ctrl_in;
  MPI_Request ctrl_req;
  wa_msg fin_msg;
  MPI_Request *fin_rq;
  unsigned char *fin_from;
  int fins;

  wa_buf *published;
  int64_t published_version;

  wa_coll *active;  /* collectives created and not yet complete */
  wa_coll *pending; /* completed on this rank's behalf; the application has not called yet */
  /* WA_GLOBAL_OVERLAP: the global this rank contributed to whose average it has not applied yet.
   * While running it is also on `active`; once complete it is on neither list (done = 1). Its
   * contrib_snap is the snapshot U. */
  wa_coll *outstanding;
  int outstanding_done;

  int64_t next_t;
  wa_req *req;
  int busy;

  int *scratch; /* P ints for group computation */
  int *info_group, *info_stale, *failed;
  int n_failed;
  wa_info last; /* what the last completed call did; arrays point into info_group/info_stale */
};

int wai_engine_is_global(const wa_engine *e, int64_t t);
int wai_engine_take_request(wa_engine *e);          /* engine thread, mu held */
int wai_engine_on_act(wa_engine *e, int src, const wa_msg *msg);
int wai_engine_complete(wa_engine *e, wa_coll *c);  /* a collective finished: deliver or keep pending */
void wai_engine_fail(wa_engine *e, int code, const char *fmt, ...);
double wa_now(void);

/* ---- exit_report.c: names the missing peers when the process exits inside MPI ---- */
void wai_exit_report_register(wa_engine *e);
void wai_exit_report_unregister(wa_engine *e);


#define WA_CHECK_MPI(e, call)                                                  \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != MPI_SUCCESS) {                                                  \
      char s_[MPI_MAX_ERROR_STRING];                                           \
      int l_ = 0;                                                              \
      MPI_Error_string(rc_, s_, &l_);                                          \
      wai_engine_fail((e), WA_EMPI, "%s failed: %s", #call, s_);                   \
      return WA_EMPI;                                                          \
    }                                                                          \
  } while (0)

#endif
