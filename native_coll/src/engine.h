/* The engine object, shared by the files that make up the engine and by nothing else:
 *   lifecycle.c   wa_create, wa_close, wa_destroy and the engine's exit report;
 *   calls.c       the application calls (wa_allreduce, wa_settle, wa_synchronize, wa_publish, ...)
 *                 and the hand-over of a request to the progress thread;
 *   activation.c  the progress thread's poll: the application's request, the peers' activations,
 *                 every collective under way, the end of a close;
 *   results.c     handing a finished result to the waiting call (the late rules, synchronize's);
 *   overlap.c     WA_GLOBAL_OVERLAP: the snapshot of an overlapped global and its apply rule;
 *   failure.c     the one place the engine breaks, and the messages that name unanswered ranks;
 *   ulfm.c        Open MPI's fault tolerance: revoke on a lost process, name the dead ranks.
 * Every piece of engine state is guarded by e->mu. The collective (coll.c, which chooses its
 * schedule once: schedule.c direct, schedule_hier.c node-aware, through a table of operations;
 * node_layout.c caches the member sets' node layouts), the progress thread (progress.c) and the
 * exit report (exit_report.c) never see this struct: they get the wire and one callback each
 * (wa_internal.h). */
#ifndef NATIVE_COLL_ENGINE_H
#define NATIVE_COLL_ENGINE_H

#include "wa_internal.h"

enum { REQ_ALLREDUCE = 1, REQ_CLOSE = 2, REQ_SETTLE = 3, REQ_SYNC = 4 };

/* An application call handed to the progress thread (lives on the calling thread's stack). */
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
  int nonfinite_own;  /* WA_ENONFINITE: this rank's own data held the NaN or inf */
  int kept_iteration; /* WA_ENONFINITE for a poisoned overlapped global, before the call's own
                         iteration ran: that iteration stays the next one */
} wa_req;

struct wa_engine {
  wai_wire wire; /* comm, rank, n, tag window, pool: what the schedule is given */
  int P, S;
  int64_t tau;
  int global_mode; /* WA_GLOBAL_* */
  double timeout;
  double call_start; /* wa_wait_began: when the next call's wait began (0: at the call) */
  float *buf;
  wa_pool pool;

  pthread_mutex_t mu;
  pthread_cond_t wake; /* engine thread sleeps here */
  pthread_cond_t done; /* application thread waits here */
  wai_progress progress;
  int closing, closed;
  int broken;             /* the first failure's WA_E* code (wai_engine_break); 0 while usable */
  char err[512];
  int failed_peer;        /* the peer of the MPI call that broke the engine (-1: MPI did not say) */
  int64_t failed_t;       /* the collective whose progress broke it (INT64_MIN: none) */
  int mpi_named;          /* the MPI error that broke it has been named to a call */
  char **where;           /* per rank "host H, pid P" (wa_describe_ranks), for messages */
  wai_exit_entry exit_entry;

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
  int outstanding_told; /* its snapshot U was not finite, which the global call itself reported:
                           its poisoned average is dropped without a second report */
  /* WA_GLOBAL_OVERLAP: the outer step (wa_set_outer) applied to A before the APPLY rule; the
   * arrays belong to the caller. NULL: A is applied as it is. */
  float *outer_prev, *outer_mom;
  float outer_mu, outer_keep, outer_push; /* mu, 1 - lr, lr * mu (rounded once, as the caller) */
  /* The 16-bit wire's base B (wa_set_global_precision), also in wire.global_base; the caller's.
   * WA_GLOBAL_OVERLAP: the engine makes it the applied global model (overlap.c). */
  float *global_base;

  int64_t next_t;
  int64_t syncs; /* wa_synchronize calls taken by the progress thread */
  wa_req *req;
  int busy;

  int *node_of;  /* P: each rank's node (lifecycle.c, node_map); NULL: no node-aware schedule */
  wai_layout_cache layouts; /* the node layouts of member sets (node_layout.c), wire.layouts */
  int *scratch; /* P ints for group computation */
  int *info_group, *info_stale, *failed;
  int n_failed;
  int lost_known;         /* ulfm.c: the engine broke on dead processes, named in failed */
  double ulfm_next_watch; /* ulfm.c: when the progress thread next asks the MPI who is dead */
  wa_info last; /* what the last completed call did; arrays point into info_group/info_stale */
};

/* The collectives of wa_synchronize run outside the iteration schedule, over every rank, with the
 * schedule of a global iteration: the k-th one of an engine is numbered t = -1 - k, so a peer's
 * activation names it and it has tags of its own (wai_tag_data, wai_tag_res). */
static inline int64_t wai_sync_t(int64_t k) { return -1 - k; }

/* Whether collective t runs over every rank: a global iteration or a synchronize. */
static inline int wai_is_global(const wa_engine *e, int64_t t) {
  return t < 0 || (t + 1) % e->tau == 0;
}

/* Finish the application's request r with `status`: its thread, waiting on e->done, returns
 * (mu held). */
static inline void wai_request_end(wa_engine *e, wa_req *r, int status) {
  r->status = status;
  r->done = 1;
  pthread_cond_broadcast(&e->done);
}

static inline void wai_request_done(wa_engine *e, wa_req *r) { wai_request_end(e, r, WA_OK); }

/* activation.c: the progress thread's poll callback (progress.c), mu held; the collective of
 * iteration t on a list (NULL when there is none); a new idle collective for iteration t on the
 * active list. */
int wai_engine_poll(void *ctx, size_t *inflight);
wa_coll *wai_engine_find(wa_coll *list, int64_t t);
int wai_new_active(wa_engine *e, int64_t t, wa_coll **out, wai_err *err);

/* results.c: hand c's result to the waiting application call r and free c (c is on no list any
 * more; mu held, r's thread blocked in its call, so writing e->buf is allowed). */
int wai_deliver_and_free(wa_engine *e, wa_coll *c, wa_req *r, wai_err *err);
/* results.c: end r with WA_ENONFINITE because collective t's result (or this rank's late merge of
 * it) held NaN or inf; `own`: this rank's own data did (mu held). buf and e->published are the
 * caller's to leave alone. */
void wai_refuse(wa_engine *e, wa_req *r, int64_t t, int own);

/* overlap.c (WA_GLOBAL_OVERLAP, mu held, r's thread blocked in its call). */
int wai_start_overlapped_global(wa_engine *e, wa_req *r, wai_err *err);
int wai_apply_outstanding(wa_engine *e, wa_req *r); /* 1: it ended r (WA_ENONFINITE) */

/* failure.c. wai_engine_break: the one place the engine becomes unusable (mu held). The others
 * name the ranks that did not answer in e->failed and e->err and return the call's WA_E* code:
 * a request that did not finish (r->taken, the collective it waited on), a close that timed out. */
void wai_engine_break(wa_engine *e, const wai_err *err);
int wai_name_request_failure(wa_engine *e, wa_req *r);
int wai_name_break(wa_engine *e);
int wai_name_close_failure(wa_engine *e);
/* What messages call collective t: "global iteration 5", "group iteration 6", "synchronize". No
 * lock, no MPI call (the exit report uses it too). */
void wai_coll_name(const wa_engine *e, int64_t t, char *s, size_t cap);

/* ulfm.c (Open MPI's ULFM; without it they do nothing, mu held). wai_ulfm_watch, from the poll:
 * WA_EPEER (the communicator revoked, e->failed named) once the MPI reports a member dead.
 * wai_ulfm_on_error: an MPI call failed; revoke, and when members are dead turn err into WA_EPEER
 * naming them. */
int wai_ulfm_watch(wa_engine *e, wai_err *err);
void wai_ulfm_on_error(wa_engine *e, wai_err *err);

/* calls.c: post a request to the progress thread and wait for it (mu held); 1 when it finished,
 * 0 when the deadline passed first. */
int wai_post_and_wait(wa_engine *e, wa_req *r, double deadline);

#endif
