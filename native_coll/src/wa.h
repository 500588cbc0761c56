/*
 * native_coll: a wait-avoiding, externally triggerable group allreduce over MPI.
 *
 * Contract (what callers may rely on)
 * -----------------------------------
 * One engine per (communicator, buffer). The engine duplicates the communicator and runs a progress
 * thread that serves this rank's part of collectives while the application thread is busy.
 *
 * Iterations are counted from 0. Iteration t is GLOBAL when (t + 1) % sync_period == 0, else GROUP.
 *  - GLOBAL, global_mode WA_GLOBAL_BLOCKING (the default): buf becomes the average of every rank's
 *    buf, bitwise identical on all ranks; the call waits for the slowest rank to arrive.
 *  - GLOBAL, global_mode WA_GLOBAL_OVERLAP: the call snapshots buf (U, this rank's contribution and
 *    its published model) and returns at once, leaving buf alone; the average A of every rank's
 *    snapshot completes in the background (the progress thread). Global iterations are never run
 *    on a rank's behalf: every contribution is the rank's own snapshot, so A is the same average
 *    a blocking global gives, bitwise identical on all ranks. The first later call (wa_allreduce,
 *    wa_settle, wa_synchronize) that finds A complete applies it before anything else:
 *      buf = A + (buf - U)   (the APPLY rule: the rank's own progress since its snapshot stays on
 *                             top, so the sum of the models over the ranks is conserved);
 *    replicas then differ only by each rank's progress since its snapshot. info.global_lag reports
 *    how many iterations that progress spans (the call's iteration minus the global's).
 *    Bound: the call for the next global iteration (t + sync_period), wa_settle and
 *    wa_synchronize wait until A is complete, i.e. until every rank has arrived at t; so a rank
 *    is never more than 2 * sync_period iterations ahead of the slowest (blocking: sync_period),
 *    global_lag <= sync_period, and a stand-in contribution in a group is at most 2 * sync_period
 *    iterations old.
 *  - GROUP over G = wa_group_of(P, S, t, rank): the first member to call activates the collective;
 *    members that have not called take part through their progress thread with their last published
 *    contribution. On-time members get the group average, bitwise identical among them. A member that
 *    calls after its group finished gets, per its `late` rule:
 *      WA_LATE_MERGE   R + (W_fresh - W_used) / |G|  (what it would have got on time),
 *      WA_LATE_DISCARD R                             (its fresh contents are dropped),
 *      WA_LATE_APPLY   R + (W_fresh - W_used)        (all its progress since the contribution the
 *                      group used goes on top of R, so the sum of the models over the ranks is
 *                      conserved: no member's progress is lost, the on-time members get it at the
 *                      next average instead of this one).
 *  - Every call publishes buf first; on return the result becomes the published contribution
 *    (zeros with `reset`). A contribution is a snapshot: between calls the engine never touches buf.
 *  - Each chunk of a result is reduced exactly once, by its owner, in member order, then sent to all:
 *    this is what makes results bitwise identical across members.
 *  - Non-finite values never enter buf from a peer. The owner of a chunk tests it in the loop that
 *    reduces it (no pass of its own) and, when it holds NaN or inf, sends it with its first element
 *    set to NaN; so a result holds a non-finite value iff the first element of one of its chunks is NaN,
 *    which every member reads in O(group size), and every member reaches the same verdict (results
 *    are bitwise identical). A poisoned result is never applied nor published: the call returns
 *    WA_ENONFINITE, buf is this rank's contribution (what the caller passed in, with the
 *    overlapped global the call applied first, if any: info.applied_global), the published
 *    contribution stays the one before the call, and the engine stays usable. Per call:
 *      GROUP or blocking GLOBAL: the iteration is used up (the next call runs the next one); on time
 *        or late alike. A late member whose MERGE or APPLY of a finite R is not finite (its fresh
 *        buf holds NaN or inf) gets WA_ENONFINITE alone, the same way.
 *      Overlapped GLOBAL: a snapshot U that is not finite is still contributed (the peers' A must
 *        complete) but not published, and the global call itself returns WA_ENONFINITE; every
 *        other rank gets it at the call that would have applied A (wa_allreduce: before running
 *        its own iteration, which stays next; wa_settle). Each rank is told once.
 *      wa_synchronize: WA_ENONFINITE when its own average is poisoned; an outstanding poisoned A
 *        is dropped there without a report, as the synchronize's average, over every rank's buf,
 *        takes its place.
 *    info.iteration then names the refused collective and info.nonfinite_own says whether this
 *    rank's own contribution (fresh, stand-in or snapshot) held the NaN or inf.
 *  - Global iterations may exchange 16-bit values instead of float32 (wa_set_global_precision):
 *    half the bytes on the wire; group iterations and wa_synchronize stay float32.
 *
 * Threading: the wa_* calls are made from one application thread per engine. MPI must be initialised
 * with MPI_THREAD_MULTIPLE. All functions return WA_OK or a WA_E* code; wa_last_error() explains.
 */
#ifndef NATIVE_COLL_WA_H
#define NATIVE_COLL_WA_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  WA_OK = 0,
  WA_EINVAL = 1,   /* bad argument: see wa_last_error() */
  WA_ETIMEOUT = 2, /* a collective did not complete within the timeout: see wa_failed_ranks() */
  WA_EMPI = 3,     /* an MPI call failed: the engine is unusable */
  WA_ECLOSED = 4,  /* the engine was closed */
  WA_ENOMEM = 5,   /* out of memory */
  WA_EBROKEN = 6,  /* an earlier error left the engine unusable: close it */
  WA_EBUSY = 7,    /* a call is already in progress on this engine (another thread) */
  WA_EPEER = 8,    /* MPI failed while peers had not delivered (a lost process, node or link):
                      wa_failed_ranks() names them; the engine is unusable. Under ULFM
                      (wa_have_ulfm) every call returns it once a member died: see there */
  WA_ENONFINITE = 9 /* the result held NaN or inf and was not applied (see the contract above;
                       info.iteration, info.nonfinite_own); the engine stays usable */
};

typedef struct wa_engine wa_engine;

/* What one collective did, as seen by this rank. Arrays are owned by the engine and stay valid
 * until the next call on it. */
typedef struct wa_info {
  int64_t iteration;
  int is_global;
  const int *group; /* sorted ranks of the group */
  int group_len;
  const int *stale; /* sorted ranks whose contribution was not fresh */
  int stale_len;
  int64_t staleness; /* largest number of iterations a contribution was behind; 0 if all fresh */
  double wait_s;     /* seconds the call spent */
  int64_t applied_global; /* WA_GLOBAL_OVERLAP: the global iteration whose average this call
                             applied to buf before its own iteration, else -1 */
  int64_t global_lag;     /* iterations between that global's snapshot and this call, else 0 */
  int nodes;              /* the node-aware schedule ran across this many nodes; 0: the direct one */
  int nonfinite_own;      /* WA_ENONFINITE: 1 when this rank's own data held the NaN or inf */
  int64_t bytes_sent;     /* bytes of data and result messages this rank handed to MPI for the
                             collective (the ACT control messages not counted) */
} wa_info;

/* How global iterations run (see the contract above). */
enum { WA_GLOBAL_BLOCKING = 0, WA_GLOBAL_OVERLAP = 1 };

/* Collective over `comm`. `buf` (n floats) stays in use until wa_destroy. Publishes buf.
 * The first iteration is `start_iteration` (a resumed run continues its group/global schedule).
 * `global_mode` is WA_GLOBAL_BLOCKING or WA_GLOBAL_OVERLAP, the same on every rank. */
int wa_create(MPI_Comm comm, float *buf, size_t n, int group_size, int64_t sync_period,
              int64_t start_iteration, int global_mode, double timeout_s, wa_engine **out,
              char *err, size_t errlen);

/* What a late member gets (see the contract above). */
enum { WA_LATE_MERGE = 0, WA_LATE_DISCARD = 1, WA_LATE_APPLY = 2 };

/* One iteration (wa_next_iteration()): averages buf in place and fills *info. `late` is one of
 * WA_LATE_*. */
int wa_allreduce(wa_engine *e, int late, int reset, wa_info *info);

/* WA_GLOBAL_OVERLAP: wait (up to the timeout) for the outstanding global average, if any, and
 * apply it to buf (info->applied_global, info->global_lag; the other fields describe that global).
 * No other communication; returns WA_OK at once when nothing is outstanding (applied_global -1). */
int wa_settle(wa_engine *e, wa_info *info);

/* Collective, outside the iteration schedule (every rank calls it, at the same point of its own
 * sequence of calls): wa_settle, then buf becomes the average of every rank's buf, bitwise
 * identical on all ranks (the sum in rank order divided by the number of ranks: a blocking global's
 * schedule, each chunk reduced once by its owner), and is published. For checkpoints and
 * evaluation. Bounded by the timeout. */
int wa_synchronize(wa_engine *e, wa_info *info);

/* WA_GLOBAL_OVERLAP: an outer optimizer step on every global average (DiLoCo's outer Nesterov
 * momentum), taken where the average is applied. With it set, applying average A computes, per
 * element in float32 and in this order (mu, 1 - lr and lr * mu rounded to float32 once):
 *   d = prev - A;  mom = mu * mom + d;  T = A + ((1 - lr) * d - (lr * mu) * mom);  prev = T;
 *   buf = T + (buf - U)            (the APPLY rule with T in place of A)
 * T is PyTorch SGD's Nesterov step prev - lr * (d + mu * mom) on the pseudo-gradient d, written
 * so that lr = 1, mu = 0 gives A exactly. Identical prev, mom and A (A is) give a bitwise
 * identical T on every rank. prev and mom (n floats each) belong to the caller, stay valid until
 * the next wa_set_outer or wa_destroy, and are written only inside a call that applies a global.
 * prev = mom = NULL turns it off. WA_EINVAL in blocking mode (there the caller steps after the
 * global call) or for lr <= 0 or mu outside [0, 1). Set it between calls (WA_EBUSY otherwise). */
int wa_set_outer(wa_engine *e, float *prev, float *mom, double lr, double mu);

/* The wire precision of global iterations (wa_set_global_precision). */
enum { WA_PRECISION_FP32 = 0, WA_PRECISION_BF16 = 1, WA_PRECISION_FP16 = 2 };

/* Global iterations (not wa_synchronize, not group iterations) exchange 16-bit pseudo-gradients
 * instead of float32 models. `base` (B, n floats) is the last global model, bitwise identical on
 * every rank; it belongs to the caller and stays valid until the next wa_set_global_precision or
 * wa_destroy. Per element, in float32:
 *   each member i sends d_i = round16(buf_i - B)      (its chunks, MPI_UINT16_T: half the bytes)
 *   the owner of a chunk sums decode(d_i) in member order, divides by S, and sends
 *   m = round16(sum / S)                              (rounded once, 16 bits again)
 *   every member, the owner included: A = B + decode(m)
 * so A is bitwise identical on every rank. round16 is round-to-nearest-even to bfloat16
 * (WA_PRECISION_BF16: 8 bits of significand, float32's range) or IEEE binary16 (WA_PRECISION_FP16:
 * 11 bits, |x| <= 65504; 65520 and beyond overflow to inf, below 6.1e-5 subnormal, below 3e-8
 * zero); NaN stays NaN. B must become the new global model after each global, so that the next
 * one's deltas are taken from it:
 *   WA_GLOBAL_BLOCKING: the caller updates B between calls (to A, or to its outer step's result)
 *     and never during one; the engine only reads it, inside a global call.
 *   WA_GLOBAL_OVERLAP: the engine writes it where it applies A (before the rank's next global
 *     snapshot, on every rank): B = A, or B = T with wa_set_outer (base may then be prev itself);
 *     the caller writes it only while no global is outstanding (after wa_settle).
 * The non-finite guard works on the 16-bit values: a contribution whose delta is NaN or inf, or
 * overflows to inf in 16 bits, poisons the result (WA_ENONFINITE on every member; the overlapped
 * global call of the rank whose delta it was returns it itself; info.nonfinite_own names that rank),
 * as does a sum that overflows. Such collectives always run the direct schedule (schedule.c), never
 * the node-aware one. Globals are never run on a rank's behalf, so every contribution is the
 * member's own buf (or snapshot): no stand-in is ever encoded. The late rules and the overlapped
 * apply rule act on the decoded float32 A as before. WA_PRECISION_FP32 (base may be NULL) restores
 * the float32 wire. Every rank sets the same precision, and all agree (e.g. a barrier), before any
 * rank's first wa_allreduce: a peer's activation can create a global collective on this rank
 * before this rank's first call, and it keeps the wire it was created with. WA_EINVAL for another
 * precision or a NULL base, or while a global iteration on another wire exists on this rank (one a
 * peer's activation created, or this rank's outstanding overlapped global): the engine is left as
 * it was. WA_EBUSY during a call. */
int wa_set_global_precision(wa_engine *e, int precision, float *base);

/* round16 of wa_set_global_precision applied to x[0, n) in place and decoded back to float32 (for
 * tests of the conversion); 1 when a value is then NaN or inf, else 0 (-1: a bad precision). */
int wa_wire_round(int precision, float *x, size_t n);

/* The non-finite guard (the contract above) is on from wa_create. Off (on = 0), results are
 * neither tested nor refused, so NaN and inf reach buf: only for measuring what the guard costs, on
 * every rank alike. Set it between calls (WA_EBUSY otherwise). */
int wa_set_nonfinite_guard(wa_engine *e, int on);

/* Make buf's current contents this rank's contribution; no communication. */
int wa_publish(wa_engine *e);

/* 1 when peers already activated the next iteration with this rank's published contribution
 * (it is running or finished on this rank's behalf, so fresh data can no longer join it), else 0. */
int wa_ready(wa_engine *e);

/* WA_GLOBAL_OVERLAP: 1 while the outstanding global average is incomplete (some rank has not made
 * its global call yet), so the next global call, wa_settle and wa_synchronize would wait for it;
 * else 0. A caller that must also hear of other events while that lasts polls this first. */
int wa_global_pending(wa_engine *e);

/* A statistic for tests: how many node layouts of member sets the engine has computed for the
 * node-aware schedule (once per distinct member set while it stays among the last 32 sets). */
int64_t wa_layouts_computed(wa_engine *e);

/* The caller has been waiting for its next call's collective since t (CLOCK_MONOTONIC seconds;
 * e.g. it polled wa_global_pending while listening for other events): that call's timeout, and
 * its wait_s, count from t instead of from the call, so a wait in two steps stays within one
 * timeout. Applies to the next wa_allreduce or wa_settle only. */
int wa_wait_began(wa_engine *e, double t);

int64_t wa_next_iteration(const wa_engine *e);

/* Collective shutdown: waits (up to the timeout) until every rank has called wa_close and every
 * collective involving this rank has finished. After a failure it releases what it safely can. */
int wa_close(wa_engine *e);

/* Frees the engine (calls a local, non-collective stop if wa_close was not completed). */
void wa_destroy(wa_engine *e);

const char *wa_last_error(const wa_engine *e);

/* Optional: a description of every rank (e.g. "host n1, pid 1234"; `where` has P entries, copied),
 * used in the exit report. When the process exits inside MPI while a collective is in flight
 * (MPI aborting the rank after a peer's connection failed: a dead node or process), an atexit
 * hook prints one line per such engine to stderr naming the ranks that had not delivered their
 * part, with these descriptions. */
int wa_describe_ranks(wa_engine *e, const char *const *where);

/* 1 when the engine was built with Open MPI's ULFM extension (mpi-ext.h, MPIX_Comm_revoke), else 0.
 * With it, and a job run with fault tolerance on (mpirun --with-ft ulfm), a member's death is
 * not a timeout: the first rank to learn of it (an MPI error, or the runtime's failure notice
 * that the progress thread checks every few ms) revokes the engine's communicator, so every
 * pending and later call on every rank returns WA_EPEER within moments, wa_failed_ranks() naming
 * the dead ranks. The engine is then unusable: the caller shrinks the communicator (MPIX_Comm_agree,
 * MPIX_Comm_shrink) and creates a new engine on it. */
int wa_have_ulfm(void);

/* Ranks that did not answer in the last WA_ETIMEOUT or WA_EPEER; returns their count. */
int wa_failed_ranks(const wa_engine *e, const int **ranks);

/* The group rule (pure function). Writes the sorted members of `rank`'s group at iteration t
 * into out (capacity >= P) and returns their count.
 *  - S <= 1: {rank}.  S >= P: all ranks.
 *  - P and S powers of two (butterfly): b = log2 S, L = log2 P, phases = ceil(L / b),
 *    k = t mod phases; members differ from rank only in the b-bit field starting at
 *    min(k * b, L - b). After `phases` iterations every rank has mixed with every other.
 *  - Otherwise: m = floor(P / S) groups; the ranks are put in a pseudo-random order that depends
 *    only on t (splitmix64-seeded Fisher-Yates) and cut into m consecutive blocks whose sizes differ
 *    by at most one, so every group has between S and 2S - 1 members. */
int wa_group_of(int P, int S, int64_t t, int rank, int *out);

#ifdef __cplusplus
}
#endif
#endif
