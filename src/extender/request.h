/*
 * What the verbs of the decisions layer share, and only they: reading a
 * request (the body, its pod, its candidate nodes), answering a wrong one,
 * and the placement search's budget. Not for layers above: decide.h is.
 */
#ifndef KGPU_EXT_REQUEST_H
#define KGPU_EXT_REQUEST_H

#include "decide.h"
#include "jsonw.h"

#define REASON_MAX  300
#define INVALID_MAX (KGPU_ERROR_MSG_MAX + 8) /* "kgpu: " and the pod's error */

/* NodeNames already read by ext_fast_node_names (owned list), or none: count -1. */
typedef struct fast_names {
    const char **names;
    int n;
} fast_names;

/*
 * The fast path of filter and prioritize: the top-level NodeNames array is
 * read into *names (strings copied into `store`, len + 1 bytes) and replaced
 * by `null` in `body`. -1: the caller parses everything with jansson.
 */
int ext_fast_node_names(char *body, size_t len, char *store, const char ***names);

/* 400 with the verb's own reply shape carrying Error: a request kube-scheduler would not send. */
void ext_bad_request(ext_ctx *d, ext_response *r, enum ext_verb v, const char *msg);
/* Counts and logs a pod whose GPU request kgpu cannot honour; the verb answers 200 for it. */
void ext_invalid_pod(ext_ctx *d, enum ext_verb v, const kgpu_pod *pod, const char *why);
/* Parses a request body into an object; NULL after replying 400. */
json_t *ext_parse_body(ext_ctx *d, ext_response *r, enum ext_verb v, const char *body, size_t len);
/*
 * The pod of ExtenderArgs / ExtenderPreemptionArgs, read; false after
 * replying 400 (no Pod object). A pod kgpu cannot honour is read as far as
 * it goes and its reason, "kgpu: ...", put in `invalid` (else "").
 */
bool ext_read_pod(ext_ctx *d, ext_response *r, enum ext_verb v, json_t *args, kgpu_pod *pod,
                  char *invalid, size_t len);
/*
 * Compiles a readable pod's requests and resolves its policy (caller holds
 * the state lock). A pod kgpu cannot honour gets its reason in `invalid`;
 * other failures (out of memory) return their code.
 */
int ext_check_pod(ext_ctx *d, kgpu_pod *pod, kgpu_policy **policy, char *invalid, size_t len);
/*
 * Candidate nodes: NodeNames (nodeCacheCapable: true) or Nodes.items
 * (nodeCacheCapable: false). *objects gets the Node objects in the second
 * mode (borrowed from args). Returns the count, or -1 after replying 400.
 */
int ext_read_nodes(ext_ctx *d, ext_response *r, enum ext_verb v, json_t *args, fast_names *fast,
                   const char ***names, json_t ***objects);
/* Could the pod ever run on this node, even empty? If not, preemption cannot help. */
bool ext_never_fits(const kgpu_node *n, const kgpu_request *req, char *why, size_t len);

/*
 * Steps of the placement search (kgpu_place_all) that one filter or preempt
 * call may spend over all the nodes it was sent, under the state lock: ten
 * nodes' worth of a full search (4-10 ms each measured on 8 to 32 GPUs,
 * sixteen containers, optimised build), so under 100 ms. A pod that defeats
 * greedy placement on many nodes (only pods of many containers can) gets
 * the full search on the first nodes and greedy's answer on the rest, each
 * refusal saying the search was cut; a cut search never makes a node
 * unresolvable. Bind searches one node, with the full budget, so whatever
 * filter passed, bind still places.
 */
#define CALL_SEARCH_STEPS (10L * KGPU_PLACE_BUDGET)
/*
 * Whether reqs fit node idx (kgpu_place_all's answer), from what is left of
 * the call's search budget (*left, decreased by what this one spent). One
 * request with nothing to undo takes kgpu_fit, the single-container fast path.
 */
int ext_place_budgeted(const kgpu_cluster *c, int idx, const kgpu_assignment *release,
                       int nrelease, const kgpu_request *const *reqs, int nreqs, unsigned flags,
                       long *left, char *why, size_t len);
/* Appends "node":"reason" to a FailedNodes-style map being written. */
void ext_add_reason(kgpu_jsonw *w, const char *node, const char *why);
/* Answers 200 with what w holds. */
void ext_reply_written(ext_response *r, kgpu_jsonw *w);
/*
 * Answers a filter-style call (filter, filter-gpuless): the nodes whose
 * pass[i] is set, as Nodes.items (objects given: nodeCacheCapable false) or
 * NodeNames, and the two reason maps being written (finished here).
 */
void ext_reply_filter(ext_response *r, int n, const char *const *names, json_t *const *objects,
                      const bool *pass, kgpu_jsonw *failed, kgpu_jsonw *unresolvable);
/* text into why, cut to fit. */
void ext_cut_reason(char *why, size_t len, const char *text);

/*
 * prioritize's scores of DRA pod `pod` (its object pj) on nodes idx[0..n)
 * (cluster indices; -1: not a DRA node, 0 there), every request of class
 * gpu.kgpu.io of its claims together (dra_score.c): scores[i] 0..10. 0 with
 * `why` saying why it scores 0 everywhere ("" when not) and `note` what was
 * not trusted or where it does not fit ("" none); a negative error (out of
 * memory) in err. Caller holds st->mu; the cluster is as it was on return.
 */
int ext_dra_score(ext_state *st, const kgpu_pod *pod, const json_t *pj, const int *idx, int n,
                  int *scores, char *why, size_t len, char *note, size_t nlen, kgpu_error *err);

/* The verbs (filter.c, prioritize.c, bind.c, preempt.c), called by ext_decide. */
void ext_verb_filter(ext_ctx *d, json_t *args, fast_names *fast, ext_response *r);
void ext_verb_prioritize(ext_ctx *d, json_t *args, fast_names *fast, ext_response *r,
                         bool gpuless);
void ext_verb_bind(ext_ctx *d, json_t *args, ext_response *r);
void ext_verb_preempt(ext_ctx *d, json_t *args, ext_response *r);

#endif
