/*
 * policy.c - the policy's own functions: its names, copies and lookups,
 * and the check of the names it carries (groups, tasks, kinds).
 *
 * The policy is built by config.c, whose table holds every default
 * (mts_policy_defaults), and read by limits.c, admit.c and the rest: this
 * file calls neither, so every module that holds a policy can use it
 * without a call back up the layers (scripts/objcycle.py).
 */
#include "mts_policy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mtcommon.h"

const char *mts_measure_name(enum mts_measure m)
{
	switch (m) {
	case MTS_MEASURE_RSS:
		return "rss";
	case MTS_MEASURE_MAX:
		return "max";
	default:
		return "accounted";
	}
}

void mts_policy_free(struct mts_policy *p)
{
	if (!p)
		return;
	for (uint32_t i = 0; i < p->ngroups; i++) {
		free(p->groups[i].name);
		free(p->groups[i].uids);
		free(p->groups[i].gids);
	}
	free(p->groups);
	/* Do not leave the secrets in freed memory. */
	if (p->tcp_token) {
		explicit_bzero(p->tcp_token, strlen(p->tcp_token));
		free(p->tcp_token);
	}
	if (p->metrics_token) {
		explicit_bzero(p->metrics_token, strlen(p->metrics_token));
		free(p->metrics_token);
	}
	free(p->guard_cgroup);
	memset(p, 0, sizeof(*p));
}

/* *dst = a copy of n ids at src (NULL when n is 0). 0 or -ENOMEM. */
static int u32_dup(uint32_t **dst, const uint32_t *src, uint32_t n)
{
	*dst = NULL;
	if (!n)
		return 0;
	*dst = malloc(n * sizeof(**dst));
	if (!*dst)
		return -ENOMEM;
	memcpy(*dst, src, n * sizeof(**dst));
	return 0;
}

int mts_policy_copy(struct mts_policy *dst, const struct mts_policy *src)
{
	struct mts_policy c = *src;
	c.groups = NULL;
	c.ngroups = 0;
	c.tcp_token = NULL;
	c.metrics_token = NULL;
	c.guard_cgroup = NULL;
	if (src->guard_cgroup) {
		c.guard_cgroup = strdup(src->guard_cgroup);
		if (!c.guard_cgroup)
			goto fail;
	}
	if (src->tcp_token) {
		c.tcp_token = strdup(src->tcp_token);
		if (!c.tcp_token)
			goto fail;
	}
	if (src->metrics_token) {
		c.metrics_token = strdup(src->metrics_token);
		if (!c.metrics_token)
			goto fail;
	}
	if (src->ngroups) {
		c.groups = calloc(src->ngroups, sizeof(*c.groups));
		if (!c.groups)
			goto fail;
		for (uint32_t i = 0; i < src->ngroups; i++) {
			const struct mts_group_policy *g = &src->groups[i];
			c.groups[i] = *g;
			c.groups[i].uids = NULL;
			c.groups[i].gids = NULL;
			c.ngroups = i + 1;
			c.groups[i].name = strdup(g->name);
			if (!c.groups[i].name ||
			    u32_dup(&c.groups[i].uids, g->uids, g->nuids) < 0 ||
			    u32_dup(&c.groups[i].gids, g->gids, g->ngids) < 0)
				goto fail;
		}
	}
	*dst = c;
	return 0;
fail:
	mts_policy_free(&c);
	return -ENOMEM;
}

const struct mts_group_policy *mts_policy_group(const struct mts_policy *p,
                                                const char *name)
{
	for (uint32_t i = 0; i < p->ngroups; i++)
		if (strcmp(p->groups[i].name, name) == 0)
			return &p->groups[i];
	return NULL;
}

struct mts_group_policy *mts_policy_group_add(struct mts_policy *p,
                                              const char *name)
{
	for (uint32_t i = 0; i < p->ngroups; i++)
		if (strcmp(p->groups[i].name, name) == 0)
			return &p->groups[i];
	struct mts_group_policy *g =
	    realloc(p->groups, (p->ngroups + 1) * sizeof(*g));
	if (!g)
		return NULL;
	p->groups = g;
	g = &p->groups[p->ngroups];
	memset(g, 0, sizeof(*g));
	g->name = strdup(name);
	if (!g->name)
		return NULL;
	p->ngroups++;
	return g;
}
