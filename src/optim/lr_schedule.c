/* Keras's learning-rate schedules (keras.optimizers.schedules, which tf.keras is in TF 2.16+),
 * evaluated in float32 in the order Keras's ops run, so that the values match TensorFlow's to
 * an ulp or two rather than only to double precision. */
#include "core/error.h"
#include "dist/optim.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const float lr_pi = 3.14159265358979323846f;

const char *dist_lr_schedule_name(dist_lr_schedule_kind kind) {
    switch (kind) {
    case DIST_LR_CONSTANT: return "constant";
    case DIST_LR_EXPONENTIAL_DECAY: return "ExponentialDecay";
    case DIST_LR_PIECEWISE_CONSTANT: return "PiecewiseConstantDecay";
    case DIST_LR_POLYNOMIAL_DECAY: return "PolynomialDecay";
    case DIST_LR_INVERSE_TIME_DECAY: return "InverseTimeDecay";
    case DIST_LR_COSINE_DECAY: return "CosineDecay";
    case DIST_LR_COSINE_DECAY_RESTARTS: return "CosineDecayRestarts";
    }
    return "unknown";
}

/* Keras's constructor checks, with its messages. */
static dist_status lr_schedule_check(const dist_lr_schedule *s) {
    DIST_CHECK_ARG(s, "learning-rate schedule is NULL");
    DIST_CHECK_ARG(s->version == DIST_LR_SCHEDULE_VERSION,
                   "learning-rate schedule: version %d, expected %d", s->version,
                   DIST_LR_SCHEDULE_VERSION);
    switch (s->kind) {
    case DIST_LR_CONSTANT: return DIST_OK;
    case DIST_LR_EXPONENTIAL_DECAY:
    case DIST_LR_POLYNOMIAL_DECAY:
    case DIST_LR_INVERSE_TIME_DECAY:
    case DIST_LR_COSINE_DECAY:
        DIST_CHECK_ARG(s->decay_steps > 0,
                       "%s: Argument `decay_steps` must be > 0. Received: decay_steps=%g",
                       dist_lr_schedule_name(s->kind), s->decay_steps);
        return DIST_OK;
    case DIST_LR_COSINE_DECAY_RESTARTS:
        DIST_CHECK_ARG(s->first_decay_steps > 0,
                       "CosineDecayRestarts: Argument `first_decay_steps` must be > 0. Received: "
                       "first_decay_steps=%g",
                       s->first_decay_steps);
        return DIST_OK;
    case DIST_LR_PIECEWISE_CONSTANT:
        DIST_CHECK_ARG(s->num_values >= 0 && s->num_values <= DIST_LR_SCHEDULE_MAX_VALUES &&
                           s->num_boundaries >= 0 &&
                           s->num_boundaries < DIST_LR_SCHEDULE_MAX_VALUES,
                       "PiecewiseConstantDecay: at most %d values (%d boundaries, %d values given)",
                       DIST_LR_SCHEDULE_MAX_VALUES, s->num_boundaries, s->num_values);
        DIST_CHECK_ARG(s->num_boundaries == s->num_values - 1,
                       "PiecewiseConstantDecay: The length of boundaries should be 1 less than the "
                       "length of values. Received: boundaries of length %d, and values of length "
                       "%d.",
                       s->num_boundaries, s->num_values);
        /* Keras indexes boundaries[0] on every call: no boundary is an IndexError there */
        DIST_CHECK_ARG(s->num_boundaries >= 1, "PiecewiseConstantDecay: boundaries are empty");
        return DIST_OK;
    }
    return dist_error(DIST_INVALID_ARGUMENT, "learning-rate schedule: unknown kind %d",
                      (int)s->kind);
}

/* CosineDecay's decay phase: decay_from_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * step /
 * decay_steps)) + alpha), with (1 - alpha) formed in double as Keras does in Python. */
static float lr_cosine_decay(float step, float decay_steps, float decay_from_lr, double alpha) {
    float completed = step / decay_steps;
    float cosine_decayed = 0.5f * (1.0f + cosf(lr_pi * completed));
    float decayed = (float)(1.0 - alpha) * cosine_decayed + (float)alpha;
    return decay_from_lr * decayed;
}

static float lr_piecewise(const dist_lr_schedule *s, int64_t step) {
    /* Keras sums indicator * value over the intervals (b[i-1], b[i]]: step == b[i] still takes
     * values[i], the new value starts at b[i] + 1 */
    int nb = s->num_boundaries;
    float result = 0.0f;
    result += (float)(step <= s->boundaries[0]) * (float)s->values[0];
    result += (float)(step > s->boundaries[nb - 1]) * (float)s->values[nb];
    for (int i = 0; i + 1 < nb; i++)
        result += (float)(step > s->boundaries[i] && step <= s->boundaries[i + 1]) *
                  (float)s->values[i + 1];
    return result;
}

static float lr_restarts(const dist_lr_schedule *s, float step) {
    float lr = (float)s->initial_learning_rate, alpha = (float)s->alpha;
    float t_mul = (float)s->t_mul, m_mul = (float)s->m_mul;
    float completed = step / (float)s->first_decay_steps, i_restart;
    if (t_mul == 1.0f) {
        i_restart = floorf(completed);
        completed -= i_restart;
    } else { /* period i lasts t_mul^i: find i from the geometric sum */
        i_restart = floorf(logf(1.0f - completed * (1.0f - t_mul)) / logf(t_mul));
        float sum_r = (1.0f - powf(t_mul, i_restart)) / (1.0f - t_mul);
        completed = (completed - sum_r) / powf(t_mul, i_restart);
    }
    float m_fac = powf(m_mul, i_restart);
    float cosine_decayed = 0.5f * m_fac * (1.0f + cosf(lr_pi * completed));
    float decayed = (1.0f - alpha) * cosine_decayed + alpha;
    return lr * decayed;
}

dist_status dist_lr_schedule_value(const dist_lr_schedule *s, int64_t step, float *out) {
    DIST_CHECK_ARG(out, "dist_lr_schedule_value: out is NULL");
    DIST_TRY(lr_schedule_check(s));
    DIST_CHECK_ARG(step >= 0, "learning-rate schedule: step must be >= 0, got %lld",
                   (long long)step);
    float lr = (float)s->initial_learning_rate, gs = (float)step;
    float decay_steps = (float)s->decay_steps;
    switch (s->kind) {
    case DIST_LR_CONSTANT: *out = lr; break;
    case DIST_LR_EXPONENTIAL_DECAY: {
        float p = gs / decay_steps;
        if (s->staircase) p = floorf(p);
        *out = lr * powf((float)s->decay_rate, p);
        break;
    }
    case DIST_LR_PIECEWISE_CONSTANT: *out = lr_piecewise(s, step); break;
    case DIST_LR_POLYNOMIAL_DECAY: {
        float end = (float)s->end_learning_rate;
        if (s->cycle) /* the first multiple of decay_steps at or past step (1 at step 0) */
            decay_steps *= gs == 0.0f ? 1.0f : ceilf(gs / decay_steps);
        else
            gs = fminf(gs, decay_steps);
        float p = gs / decay_steps;
        *out = (lr - end) * powf(1.0f - p, (float)s->power) + end;
        break;
    }
    case DIST_LR_INVERSE_TIME_DECAY: {
        float p = gs / decay_steps;
        if (s->staircase) p = floorf(p);
        *out = lr / (1.0f + (float)s->decay_rate * p);
        break;
    }
    case DIST_LR_COSINE_DECAY: {
        if (isnan(s->warmup_target)) { /* warmup_target=None: decay from initial_learning_rate */
            *out = lr_cosine_decay(fminf(gs, decay_steps), decay_steps, lr, s->alpha);
            break;
        }
        float target = (float)s->warmup_target, warmup_steps = (float)s->warmup_steps;
        gs = fminf(gs, decay_steps + warmup_steps);
        if (gs < warmup_steps) /* linear from initial_learning_rate to warmup_target */
            *out = (target - lr) * (gs / warmup_steps) + lr;
        else
            *out = lr_cosine_decay(gs - warmup_steps, decay_steps, target, s->alpha);
        break;
    }
    case DIST_LR_COSINE_DECAY_RESTARTS: *out = lr_restarts(s, gs); break;
    }
    return DIST_OK;
}

/* ---- NAME:key=value,... ---------------------------------------------------------------- */

enum { LR_F_DOUBLE, LR_F_BOOL, LR_F_BOUNDARIES, LR_F_VALUES, LR_F_WARMUP_TARGET };

#define LR_K(kind) (1u << (kind))
#define LR_DECAYS                                                                                  \
    (LR_K(DIST_LR_EXPONENTIAL_DECAY) | LR_K(DIST_LR_POLYNOMIAL_DECAY) |                            \
     LR_K(DIST_LR_INVERSE_TIME_DECAY) | LR_K(DIST_LR_COSINE_DECAY))

typedef struct lr_key {
    const char *name;
    int type;
    size_t offset;
    unsigned kinds; /* the schedules that take this argument */
} lr_key;

static const lr_key lr_keys[] = {
    {"initial_learning_rate", LR_F_DOUBLE, offsetof(dist_lr_schedule, initial_learning_rate),
     ~LR_K(DIST_LR_PIECEWISE_CONSTANT)},
    {"decay_steps", LR_F_DOUBLE, offsetof(dist_lr_schedule, decay_steps), LR_DECAYS},
    {"decay_rate", LR_F_DOUBLE, offsetof(dist_lr_schedule, decay_rate),
     LR_K(DIST_LR_EXPONENTIAL_DECAY) | LR_K(DIST_LR_INVERSE_TIME_DECAY)},
    {"staircase", LR_F_BOOL, offsetof(dist_lr_schedule, staircase),
     LR_K(DIST_LR_EXPONENTIAL_DECAY) | LR_K(DIST_LR_INVERSE_TIME_DECAY)},
    {"boundaries", LR_F_BOUNDARIES, 0, LR_K(DIST_LR_PIECEWISE_CONSTANT)},
    {"values", LR_F_VALUES, 0, LR_K(DIST_LR_PIECEWISE_CONSTANT)},
    {"end_learning_rate", LR_F_DOUBLE, offsetof(dist_lr_schedule, end_learning_rate),
     LR_K(DIST_LR_POLYNOMIAL_DECAY)},
    {"power", LR_F_DOUBLE, offsetof(dist_lr_schedule, power), LR_K(DIST_LR_POLYNOMIAL_DECAY)},
    {"cycle", LR_F_BOOL, offsetof(dist_lr_schedule, cycle), LR_K(DIST_LR_POLYNOMIAL_DECAY)},
    {"alpha", LR_F_DOUBLE, offsetof(dist_lr_schedule, alpha),
     LR_K(DIST_LR_COSINE_DECAY) | LR_K(DIST_LR_COSINE_DECAY_RESTARTS)},
    {"warmup_target", LR_F_WARMUP_TARGET, offsetof(dist_lr_schedule, warmup_target),
     LR_K(DIST_LR_COSINE_DECAY)},
    {"warmup_steps", LR_F_DOUBLE, offsetof(dist_lr_schedule, warmup_steps),
     LR_K(DIST_LR_COSINE_DECAY)},
    {"first_decay_steps", LR_F_DOUBLE, offsetof(dist_lr_schedule, first_decay_steps),
     LR_K(DIST_LR_COSINE_DECAY_RESTARTS)},
    {"t_mul", LR_F_DOUBLE, offsetof(dist_lr_schedule, t_mul), LR_K(DIST_LR_COSINE_DECAY_RESTARTS)},
    {"m_mul", LR_F_DOUBLE, offsetof(dist_lr_schedule, m_mul), LR_K(DIST_LR_COSINE_DECAY_RESTARTS)},
};

static const char *const lr_cli_names[] = {
    [DIST_LR_CONSTANT] = "constant",
    [DIST_LR_EXPONENTIAL_DECAY] = "exponential_decay",
    [DIST_LR_PIECEWISE_CONSTANT] = "piecewise_constant",
    [DIST_LR_POLYNOMIAL_DECAY] = "polynomial_decay",
    [DIST_LR_INVERSE_TIME_DECAY] = "inverse_time_decay",
    [DIST_LR_COSINE_DECAY] = "cosine_decay",
    [DIST_LR_COSINE_DECAY_RESTARTS] = "cosine_decay_restarts",
};
#define LR_NUM_KINDS ((int)(sizeof lr_cli_names / sizeof lr_cli_names[0]))

static int lr_parse_double(const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

/* A list separated by '/' (which a shell leaves alone) or ';' (the first form, which a shell
 * ends a command at unless quoted) into out[0..max-1]; *n its length. */
static dist_status lr_parse_list(const char *key, char *text, int is_int, double *dout,
                                 int64_t *iout, int max, int *n) {
    *n = 0;
    for (char *save = NULL, *item = strtok_r(text, "/;", &save); item;
         item = strtok_r(NULL, "/;", &save)) {
        DIST_CHECK_ARG(*n < max, "%s has more than %d entries", key, max);
        double v;
        DIST_CHECK_ARG(lr_parse_double(item, &v), "%s: '%s' is not a number", key, item);
        if (is_int) {
            DIST_CHECK_ARG(v == floor(v) && fabs(v) < 9e15, "%s: '%s' is not an integer", key,
                           item);
            iout[*n] = (int64_t)v;
        } else {
            dout[*n] = v;
        }
        (*n)++;
    }
    return DIST_OK;
}

static dist_status lr_parse_pair(dist_lr_schedule *s, char *pair) {
    char *eq = strchr(pair, '=');
    DIST_CHECK_ARG(eq && eq != pair, "expected key=value, got '%s'", pair);
    *eq = '\0';
    const char *key = pair;
    char *value = eq + 1;
    const lr_key *k = NULL;
    for (size_t i = 0; i < sizeof lr_keys / sizeof lr_keys[0]; i++)
        if (strcmp(lr_keys[i].name, key) == 0) k = &lr_keys[i];
    DIST_CHECK_ARG(k && (k->kinds & LR_K(s->kind)), "%s takes no argument '%s'",
                   lr_cli_names[s->kind], key);
    char *field = (char *)s + k->offset;
    switch (k->type) {
    case LR_F_DOUBLE:
        DIST_CHECK_ARG(lr_parse_double(value, (double *)field), "%s=%s is not a number", key,
                       value);
        return DIST_OK;
    case LR_F_WARMUP_TARGET:
        if (strcmp(value, "none") == 0 || strcmp(value, "None") == 0) {
            *(double *)field = NAN;
            return DIST_OK;
        }
        DIST_CHECK_ARG(lr_parse_double(value, (double *)field), "%s=%s is not a number or none",
                       key, value);
        return DIST_OK;
    case LR_F_BOOL:
        if (strcmp(value, "1") == 0 || strcmp(value, "true") == 0 || strcmp(value, "True") == 0)
            *(int *)field = 1;
        else if (strcmp(value, "0") == 0 || strcmp(value, "false") == 0 ||
                 strcmp(value, "False") == 0)
            *(int *)field = 0;
        else
            return dist_error(DIST_INVALID_ARGUMENT, "%s=%s is not 0, 1, true or false", key,
                              value);
        return DIST_OK;
    case LR_F_BOUNDARIES:
        return lr_parse_list(key, value, 1, NULL, s->boundaries, DIST_LR_SCHEDULE_MAX_VALUES - 1,
                             &s->num_boundaries);
    default:
        return lr_parse_list(key, value, 0, s->values, NULL, DIST_LR_SCHEDULE_MAX_VALUES,
                             &s->num_values);
    }
}

dist_status dist_lr_schedule_parse(const char *text, dist_lr_schedule *out) {
    DIST_CHECK_ARG(text && out, "dist_lr_schedule_parse: NULL argument");
    dist_lr_schedule s = DIST_LR_SCHEDULE_INIT;
    char *copy = strdup(text);
    if (!copy) return dist_error(DIST_OUT_OF_MEMORY, "learning-rate schedule: out of memory");
    dist_status st = DIST_OK;
    char *args = strchr(copy, ':');
    if (args) *args++ = '\0';
    int kind = -1;
    for (int i = 0; i < LR_NUM_KINDS; i++)
        if (strcmp(copy, lr_cli_names[i]) == 0) kind = i;
    if (kind < 0) {
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "unknown schedule '%s' (constant, "
                        "exponential_decay, piecewise_constant, polynomial_decay, "
                        "inverse_time_decay, cosine_decay, cosine_decay_restarts)",
                        copy);
        goto out;
    }
    s.kind = (dist_lr_schedule_kind)kind;
    if (args && *args) {
        for (char *save = NULL, *pair = strtok_r(args, ",", &save); pair;
             pair = strtok_r(NULL, ",", &save))
            DIST_TRY_GOTO(lr_parse_pair(&s, pair), st, out);
    }
    DIST_TRY_GOTO(lr_schedule_check(&s), st, out);
    *out = s;
out:
    free(copy);
    if (st != DIST_OK) return dist_error_context(st, "learning-rate schedule '%s'", text);
    return st;
}
