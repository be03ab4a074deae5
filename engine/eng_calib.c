/*
 * eng_calib.c -- calibration prompts for `d3stream quantize`
 * (eng_quant_int.h): generated System One requests, or a user's JSONL
 * file, rendered through the package's own prompt code.
 *
 * The generator writes what a decision service is asked: a state (a
 * support ticket, a review, a chat, a log excerpt, an e-mail, a news
 * item, a policy paragraph...) in one of ten languages, grown sentence by
 * sentence from templates and word lists until it encodes to a drawn
 * length of 100 to 2,000 tokens; and one question on it: choice (2 to 12
 * options from a label set, as criteria or choices, described or not),
 * noul (with or without criteria) or score (2 to 10 levels), with
 * instructions or without (the prompt's fallback sentence). Everything is
 * drawn from a splitmix/xorshift stream of (seed, request index), so a
 * set is the same on every machine. Nothing comes from a benchmark.
 */
#include "eng_quant_int.h"
#include "eng_util_int.h"

#include <errno.h>
#include <jansson.h>

/* ---------------------------------------------------------------------
 * Random draws
 * --------------------------------------------------------------------- */

typedef struct cal_rng {
    uint64_t s;
} cal_rng_t;

static uint64_t cal_next(cal_rng_t *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static size_t cal_below(cal_rng_t *r, size_t n) {
    return n ? (size_t)(cal_next(r) % n) : 0;
}

#define PICK(r, a) ((a)[cal_below((r), sizeof(a) / sizeof((a)[0]))])
#define COUNT(a)   (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------------
 * States: per language, sentence templates whose %N slots take words
 * (1 a name, 2 a thing, 3 a number, 4 a place, 5 a time)
 * --------------------------------------------------------------------- */

typedef struct cal_lang {
    const char *const *sent;
    size_t             n_sent;
    const char *const *names;
    size_t             n_names;
    const char *const *things;
    size_t             n_things;
    const char *const *places;
    size_t             n_places;
    const char *const *times;
    size_t             n_times;
} cal_lang_t;

static const char *const EN_SENT[] = {
    "I ordered the %2 on %5 and it still has not arrived.",
    "%1 wrote that the %2 stopped working after %3 days.",
    "The invoice shows %3 euros, but the quote from %4 said less.",
    "Please cancel my subscription before %5, I no longer need the %2.",
    "We shipped %3 units of the %2 to the warehouse in %4.",
    "Our team in %4 reported %3 failed logins overnight.",
    "The %2 is great value and %1 recommends it to everyone.",
    "Honestly the %2 was a disappointment: it broke on the first day.",
    "Can someone from support call me back about ticket %3?",
    "%1 asked whether the office in %4 is open on %5.",
    "The update to version %3 fixed the crash but made the %2 slower.",
    "Delivery to %4 usually takes %3 working days.",
    "I was charged twice for the %2 and the chat keeps timing out.",
    "The meeting with %1 moved to %5 because of the strike in %4.",
    "According to the report, sales of the %2 rose by %3 percent.",
    "Error %3: connection to the %2 service in %4 refused.",
    "The new policy applies to all employees starting %5.",
    "Thanks for the quick reply, the replacement %2 works fine.",
    "My account was locked after %3 attempts and I cannot reset the password.",
    "Reviewers praised the %2 but criticised its battery life.",
    "%1 says the package was left outside in the rain in %4.",
    "The contract renews automatically unless it is cancelled %3 days in advance.",
    "Local authorities in %4 closed the road until %5.",
    "Is it possible to upgrade to the premium %2 plan without losing data?",
    "The patient reported mild pain for %3 days and no fever.",
    "Warning: disk usage on server %3 in %4 is above 90 percent.",
    "I love how light the %2 is, but the manual is confusing.",
    "We need %3 more licences for the team in %4 by %5.",
};
static const char *const EN_NAMES[] = {"Anna",  "James",  "Priya", "Tom",   "Maria",
                                       "Chen",  "Olivia", "Ahmed", "Sofia", "Lukas",
                                       "Grace", "Mateo",  "Yuki",  "Noah",  "Fatima"};
static const char *const EN_THINGS[] = {
    "laptop",         "router",     "headphones",       "coffee machine", "subscription",
    "printer",        "invoice",    "mobile app",       "sofa",           "smart watch",
    "flight",         "hotel room", "account",          "delivery",       "camera",
    "vacuum cleaner", "course",     "insurance policy", "tablet",         "washing machine"};
static const char *const EN_PLACES[] = {"Berlin", "Lisbon", "Toronto",   "Osaka", "Nairobi",
                                        "Madrid", "Dublin", "Sao Paulo", "Milan", "Chicago"};
static const char *const EN_TIMES[] = {"Monday",      "Friday",    "the 3rd of May",
                                       "next week",   "yesterday", "the end of the month",
                                       "last Sunday", "tomorrow",  "June 14"};

static const char *const DE_SENT[] = {
    "Ich habe den %2 am %5 bestellt und er ist immer noch nicht da.",
    "%1 schreibt, dass der %2 nach %3 Tagen kaputt war.",
    "Die Rechnung zeigt %3 Euro, das Angebot aus %4 war niedriger.",
    "Bitte kündigen Sie mein Abo vor %5.",
    "Unser Team in %4 meldet %3 fehlgeschlagene Anmeldungen.",
    "Der %2 ist sein Geld wert, %1 empfiehlt ihn weiter.",
    "Kann mich jemand vom Support wegen Ticket %3 zurückrufen?",
    "Die Lieferung nach %4 dauert meist %3 Werktage.",
    "Mir wurde der %2 doppelt berechnet.",
    "Das Update auf Version %3 hat den Absturz behoben.",
};
static const char *const DE_THINGS[] = {"Laptop",  "Router",      "Drucker", "Kopfhörer",
                                        "Vertrag", "Staubsauger", "Flug",    "Fernseher"};
static const char *const DE_NAMES[] = {"Jonas", "Lena", "Felix", "Mia", "Paul", "Hannah"};
static const char *const DE_PLACES[] = {"Hamburg", "München", "Köln", "Leipzig", "Wien"};
static const char *const DE_TIMES[] = {"Montag", "Freitag", "3. Mai", "letzter Woche"};

static const char *const FR_SENT[] = {
    "J'ai commandé le %2 le %5 et il n'est toujours pas arrivé.",
    "%1 écrit que le %2 ne fonctionne plus après %3 jours.",
    "La facture indique %3 euros alors que le devis de %4 était plus bas.",
    "Merci d'annuler mon abonnement avant %5.",
    "Le %2 est excellent, %1 le recommande à tout le monde.",
    "Quelqu'un du service client peut-il me rappeler au sujet du ticket %3 ?",
    "La livraison vers %4 prend en général %3 jours ouvrés.",
    "On m'a facturé deux fois le %2.",
};
static const char *const FR_THINGS[] = {"ordinateur", "routeur", "casque", "contrat",
                                        "téléphone",  "vol",     "colis"};
static const char *const FR_NAMES[] = {"Camille", "Louis", "Chloé", "Hugo", "Inès"};
static const char *const FR_PLACES[] = {"Lyon", "Marseille", "Bordeaux", "Lille", "Genève"};
static const char *const FR_TIMES[] = {"lundi", "vendredi", "3 mai", "la semaine dernière"};

static const char *const ES_SENT[] = {
    "Pedí el %2 el %5 y todavía no ha llegado.",
    "%1 dice que el %2 dejó de funcionar a los %3 días.",
    "La factura muestra %3 euros, pero el presupuesto de %4 era menor.",
    "Por favor, cancelen mi suscripción antes del %5.",
    "El %2 es muy bueno y %1 lo recomienda.",
    "¿Alguien de soporte puede llamarme por el ticket %3?",
    "El envío a %4 suele tardar %3 días hábiles.",
    "Me cobraron dos veces el %2.",
};
static const char *const ES_THINGS[] = {"portátil", "router", "auriculares", "contrato",
                                        "móvil",    "vuelo",  "paquete"};
static const char *const ES_NAMES[] = {"Lucía", "Pablo", "Carmen", "Diego", "Elena"};
static const char *const ES_PLACES[] = {"Sevilla", "Valencia", "Bilbao", "Bogotá", "Lima"};
static const char *const ES_TIMES[] = {"lunes", "viernes", "3 de mayo", "la semana pasada"};

static const char *const IT_SENT[] = {
    "Ho ordinato il %2 il %5 e non è ancora arrivato.",
    "%1 scrive che il %2 si è rotto dopo %3 giorni.",
    "La fattura riporta %3 euro, ma il preventivo di %4 era più basso.",
    "Qualcuno dell'assistenza può richiamarmi per il ticket %3?",
    "Il %2 è ottimo e %1 lo consiglia a tutti.",
    "La consegna a %4 richiede di solito %3 giorni lavorativi.",
};
static const char *const IT_THINGS[] = {"portatile", "router", "contratto", "telefono", "volo"};
static const char *const IT_NAMES[] = {"Giulia", "Marco", "Sara", "Luca"};
static const char *const IT_PLACES[] = {"Torino", "Napoli", "Roma", "Bologna"};
static const char *const IT_TIMES[] = {"lunedì", "venerdì", "3 maggio"};

static const char *const PT_SENT[] = {
    "Encomendei o %2 no dia %5 e ainda não chegou.",
    "%1 diz que o %2 parou de funcionar depois de %3 dias.",
    "A fatura mostra %3 reais, mas o orçamento de %4 era menor.",
    "Alguém do suporte pode me ligar sobre o chamado %3?",
    "O %2 é ótimo e %1 recomenda para todos.",
    "A entrega para %4 costuma levar %3 dias úteis.",
};
static const char *const PT_THINGS[] = {"notebook", "roteador", "contrato", "celular", "voo"};
static const char *const PT_NAMES[] = {"Beatriz", "João", "Ana", "Rafael"};
static const char *const PT_PLACES[] = {"Porto", "Recife", "Curitiba", "Lisboa"};
static const char *const PT_TIMES[] = {"segunda-feira", "sexta-feira", "3 de maio"};

static const char *const NL_SENT[] = {
    "Ik heb de %2 op %5 besteld en hij is er nog steeds niet.",
    "%1 schrijft dat de %2 na %3 dagen kapot ging.",
    "Kan iemand van de klantenservice mij terugbellen over ticket %3?",
    "De levering naar %4 duurt meestal %3 werkdagen.",
    "De %2 is zijn geld waard volgens %1.",
};
static const char *const NL_THINGS[] = {"laptop", "router", "printer", "abonnement", "vlucht"};
static const char *const NL_NAMES[] = {"Daan", "Emma", "Sem", "Julia"};
static const char *const NL_PLACES[] = {"Utrecht", "Gent", "Rotterdam", "Eindhoven"};
static const char *const NL_TIMES[] = {"maandag", "vrijdag", "3 mei"};

static const char *const ZH_SENT[] = {
    "我在%5订购了%2，到现在还没有收到。", "%1说%2用了%3天就坏了。",
    "发票上写的是%3元，但%4的报价更低。", "请在%5之前取消我的订阅。",
    "%2非常好用，%1推荐给了所有朋友。",   "能否请客服就工单%3给我回电话？",
    "寄往%4的快递通常需要%3个工作日。",   "%2被重复扣费了两次。",
};
static const char *const ZH_THINGS[] = {"笔记本电脑", "路由器", "耳机", "合同", "手机", "机票"};
static const char *const ZH_NAMES[] = {"王芳", "李伟", "张敏", "刘洋"};
static const char *const ZH_PLACES[] = {"上海", "北京", "深圳", "成都"};
static const char *const ZH_TIMES[] = {"周一", "周五", "五月三日", "上周"};

static const char *const JA_SENT[] = {
    "%5に%2を注文しましたが、まだ届いていません。",
    "%1によると、%2は%3日で壊れました。",
    "請求書は%3円ですが、%4の見積もりはもっと安かったです。",
    "チケット%3の件でサポートから折り返し電話をいただけますか。",
    "%2はとても良く、%1もすすめています。",
    "%4への配送は通常%3営業日かかります。",
};
static const char *const JA_THINGS[] = {"ノートパソコン", "ルーター", "イヤホン", "契約", "スマホ"};
static const char *const JA_NAMES[] = {"佐藤", "鈴木", "高橋", "田中"};
static const char *const JA_PLACES[] = {"東京", "大阪", "札幌", "福岡"};
static const char *const JA_TIMES[] = {"月曜日", "金曜日", "五月三日", "先週"};

static const char *const RU_SENT[] = {
    "Я заказал %2 в %5, но он до сих пор не пришёл.",
    "%1 пишет, что %2 сломался через %3 дней.",
    "В счёте указано %3 рублей, а в предложении из %4 было меньше.",
    "Пожалуйста, перезвоните мне по заявке %3.",
    "%2 отличный, %1 всем его советует.",
    "Доставка в %4 обычно занимает %3 рабочих дней.",
};
static const char *const RU_THINGS[] = {"ноутбук", "роутер", "договор", "телефон", "билет"};
static const char *const RU_NAMES[] = {"Ольга", "Иван", "Мария", "Дмитрий"};
static const char *const RU_PLACES[] = {"Москву", "Казань", "Самару", "Пермь"};
static const char *const RU_TIMES[] = {"понедельник", "пятницу", "мае"};

#define LANG(p)                                                                                    \
    {                                                                                              \
        p##_SENT, COUNT(p##_SENT), p##_NAMES, COUNT(p##_NAMES), p##_THINGS, COUNT(p##_THINGS),     \
            p##_PLACES, COUNT(p##_PLACES), p##_TIMES, COUNT(p##_TIMES)                             \
    }

/* English for half of the states, the others in equal shares. */
static const cal_lang_t LANGS[] = {LANG(EN), LANG(DE), LANG(FR), LANG(ES), LANG(IT),
                                   LANG(PT), LANG(NL), LANG(ZH), LANG(JA), LANG(RU)};

static const cal_lang_t *cal_lang(cal_rng_t *r) {
    return cal_below(r, 2) ? &LANGS[0] : &LANGS[cal_below(r, COUNT(LANGS))];
}

/* One sentence of language l into b. */
static svc_err_t cal_sentence(cal_rng_t *r, const cal_lang_t *l, svc_buf_t *b) {
    const char *t = l->sent[cal_below(r, l->n_sent)];
    svc_err_t   err = SVC_OK;
    for (const char *p = t; !err && *p; p++) {
        if (p[0] != '%' || p[1] < '1' || p[1] > '5') {
            err = svc_buf_addc(b, *p);
            continue;
        }
        switch (*++p) {
        case '1':
            err = svc_buf_adds(b, l->names[cal_below(r, l->n_names)]);
            break;
        case '2':
            err = svc_buf_adds(b, l->things[cal_below(r, l->n_things)]);
            break;
        case '3':
            err = svc_buf_addf(b, "%zu", 1 + cal_below(r, cal_below(r, 2) ? 30 : 5000));
            break;
        case '4':
            err = svc_buf_adds(b, l->places[cal_below(r, l->n_places)]);
            break;
        default:
            err = svc_buf_adds(b, l->times[cal_below(r, l->n_times)]);
        }
    }
    return err;
}

/* Frames a state can take: plain prose, a chat transcript, log lines, an
 * e-mail; the separator between sentences follows it. */
static const char *const CHAT_WHO[] = {"Customer", "Agent", "User", "Bot"};

static svc_err_t cal_piece(cal_rng_t *r, const cal_lang_t *l, int frame, size_t k, svc_buf_t *b) {
    svc_err_t err = SVC_OK;
    if (frame == 1)
        err = svc_buf_addf(b, "%s%s: ", k ? "\n" : "", CHAT_WHO[k % 2 + 2 * cal_below(r, 2)]);
    else if (frame == 2)
        err = svc_buf_addf(b, "%s2026-%02zu-%02zu %02zu:%02zu:%02zu %s ", k ? "\n" : "",
                           1 + cal_below(r, 12), 1 + cal_below(r, 28), cal_below(r, 24),
                           cal_below(r, 60), cal_below(r, 60),
                           cal_below(r, 4)   ? "INFO"
                           : cal_below(r, 2) ? "WARN"
                                             : "ERROR");
    else if (k)
        err = svc_buf_adds(b, cal_below(r, 6) ? " " : "\n\n");
    return err ? err : cal_sentence(r, l, b);
}

/* A state of language l grown until it encodes to at least target tokens. */
static svc_err_t cal_state(cal_rng_t *r, const eng_tokenizer_t *tok, size_t target, svc_buf_t *b) {
    const cal_lang_t *l = cal_lang(r);
    int               frame = (int)cal_below(r, 4);
    eng_ids_t         ids;
    eng_ids_init(&ids);
    svc_err_t err = frame == 3 ? svc_buf_addf(b, "Subject: %s\n\n", l->things[0]) : SVC_OK;
    for (size_t k = 0; !err;) {
        for (size_t j = 0; !err && j < 8; j++, k++) /* re-encode every 8 sentences */
            err = cal_piece(r, l, frame, k, b);
        ids.n = 0;
        if (!err)
            err = eng_tokenizer_encode(tok, b->data, b->len, &ids);
        if (!err && ids.n >= target)
            break;
    }
    eng_ids_fini(&ids);
    return err;
}

/* ---------------------------------------------------------------------
 * Questions
 * --------------------------------------------------------------------- */

typedef struct cal_set {
    const char        *ask; /* instructions */
    const char *const *keys;
    const char *const *desc;
    size_t             n;
} cal_set_t;

static const char *const TEAM_K[] = {"billing",  "technical", "sales",   "returns",
                                     "shipping", "account",   "legal",   "security",
                                     "feedback", "general",   "partner", "press"};
static const char *const TEAM_D[] = {"Invoices, charges and refunds",
                                     "Outages, bugs and errors",
                                     "Quotes, upgrades and new contracts",
                                     "Returns and replacements",
                                     "Delivery and tracking",
                                     "Logins, passwords and profiles",
                                     "Contracts and disputes",
                                     "Fraud and suspicious activity",
                                     "Praise and suggestions",
                                     NULL,
                                     "Resellers and partners",
                                     "Journalists and media"};
static const char *const SENT_K[] = {"positive", "negative", "neutral", "mixed"};
static const char *const SENT_D[] = {"The writer is satisfied", "The writer is unhappy",
                                     "No clear opinion", "Both praise and complaints"};
static const char *const MOD_K[] = {"safe",          "spam",          "harassment", "hate",
                                    "violence",      "self_harm",     "sexual",     "illegal",
                                    "personal_data", "misinformation"};
static const char *const MOD_D[] = {NULL,
                                    "Unsolicited advertising",
                                    "Insults or threats against a person",
                                    "Attacks on a protected group",
                                    "Threats or praise of violence",
                                    "Risk of self-harm",
                                    "Sexual content",
                                    "Illegal goods or services",
                                    "Someone's private data",
                                    "False claims presented as fact"};
static const char *const TOPIC_K[] = {"sports",  "politics",  "technology", "health",
                                      "finance", "travel",    "science",    "entertainment",
                                      "food",    "education", "weather",    "housing"};
static const char *const LANG_K[] = {"english",    "german", "french",  "spanish",  "italian",
                                     "portuguese", "dutch",  "chinese", "japanese", "russian"};
static const char *const INTENT_K[] = {"cancel", "upgrade", "complaint",  "question",
                                       "refund", "praise",  "bug_report", "order_status"};

static const cal_set_t SETS[] = {
    {"Which team should handle this message?", TEAM_K, TEAM_D, COUNT(TEAM_K)},
    {"What is the sentiment of the text?", SENT_K, SENT_D, COUNT(SENT_K)},
    {"Which policy, if any, does this content violate?", MOD_K, MOD_D, COUNT(MOD_K)},
    {"What is the main topic?", TOPIC_K, NULL, COUNT(TOPIC_K)},
    {"In which language is the state written?", LANG_K, NULL, COUNT(LANG_K)},
    {"What does the customer want?", INTENT_K, NULL, COUNT(INTENT_K)},
};

static const char *const NOUL_ASK[] = {
    "Does the customer ask for a refund?",  "Is the writer angry?",
    "Does the text mention a deadline?",    "Should this be escalated to a human?",
    "Is personal data disclosed?",          "Is the problem already solved?",
    "Does the message contain a question?", "Is this message spam?",
};
static const char *const *const SCORES[] = {
    (const char *const[]){"Trivial", "Minor", "Major", "Critical"},
    (const char *const[]){"1", "2", "3", "4", "5"},
    (const char *const[]){"very negative", "negative", "neutral", "positive", "very positive"},
    (const char *const[]){"low", "high"},
    (const char *const[]){"none", "a little", "some", "a lot", "extreme", "unbearable", "unknown",
                          "not applicable", "mixed", "unclear"},
};
static const size_t      SCORE_N[] = {4, 5, 5, 2, 10};
static const char *const SCORE_ASK[] = {
    "How severe is the problem?", "Rate the urgency from 1 to 5.", "How does the writer feel?",
    "How urgent is it?", "How much pain or frustration is expressed?"};

/* Options of a choice question: k of the set's keys (2 <= k <= 12, its
 * size at most), in a random rotation, as criteria or choices. */
static json_t *cal_choice(cal_rng_t *r, const char **ask) {
    const cal_set_t *s = &PICK(r, SETS);
    size_t           k = 2 + cal_below(r, s->n - 1), first = cal_below(r, s->n);
    bool             described = s->desc && cal_below(r, 3), as_list = cal_below(r, 3) == 0;
    json_t          *opts = as_list ? json_array() : json_object();
    for (size_t i = 0; opts && i < k; i++) {
        size_t      j = (first + i) % s->n;
        const char *d = described ? s->desc[j] : NULL;
        json_t     *dv = d ? json_string(d) : json_null();
        if (as_list)
            json_array_append_new(opts,
                                  d ? json_pack("{sssO}", "key", s->keys[j], "description", dv)
                                    : json_pack("{ss}", "key", s->keys[j]));
        else
            json_object_set(opts, s->keys[j], dv);
        json_decref(dv);
    }
    *ask = s->ask;
    return json_pack("{ssso}", "type", "choice", as_list ? "choices" : "criteria", opts);
}

static json_t *cal_question(cal_rng_t *r) {
    size_t      kind = cal_below(r, 10); /* 6 choice, 2 noul, 2 score */
    const char *ask = NULL;
    json_t     *q;
    if (kind < 6)
        q = cal_choice(r, &ask);
    else if (kind < 8) {
        ask = PICK(r, NOUL_ASK);
        q = cal_below(r, 2) ? json_pack("{ss}", "type", "noul")
                            : json_pack("{sss{ssss}}", "type", "noul", "criteria", "true", "yes",
                                        "false", "no");
    } else {
        size_t  i = cal_below(r, COUNT(SCORES));
        json_t *lv = json_array();
        for (size_t j = 0; lv && j < SCORE_N[i]; j++)
            json_array_append_new(lv, json_string(SCORES[i][j]));
        ask = SCORE_ASK[i];
        q = json_pack("{ssso}", "type", "score", "criteria", lv);
    }
    /* about one in six without instructions: the prompt's fallback (SPEC c.6) */
    if (q && cal_below(r, 6))
        json_object_set_new(q, "instructions", json_string(ask));
    return q;
}

svc_err_t eng_calib_request(const eng_tokenizer_t *tok, uint64_t seed, size_t i, svc_buf_t *out) {
    cal_rng_t r = {seed * 0x100000001b3ull ^ (uint64_t)i * 0x9e3779b97f4a7c15ull};
    size_t    target =
        ENG_CALIB_STATE_MIN + cal_below(&r, ENG_CALIB_STATE_MAX - ENG_CALIB_STATE_MIN + 1);
    svc_buf_t state;
    svc_buf_init(&state, (size_t)1 << 24);
    svc_err_t err = cal_state(&r, tok, target, &state);
    json_t   *q = err ? NULL : cal_question(&r);
    json_t   *req =
        q ? json_pack("{ss%s{so}}", "state", state.data, state.len, "questions", "q", q) : NULL;
    char *text = req ? json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (!err && !text)
        err = SVC_ERR_NOMEM;
    if (!err)
        err = svc_buf_adds(out, text);
    free(text);
    json_decref(req);
    svc_buf_fini(&state);
    return err;
}

/* ---------------------------------------------------------------------
 * Rendering into sequences
 * --------------------------------------------------------------------- */

void eng_calib_init(eng_calib_t *c) {
    memset(c, 0, sizeof *c);
}

void eng_calib_fini(eng_calib_t *c) {
    for (size_t i = 0; i < c->n; i++)
        eng_ids_fini(&c->seqs[i]);
    free(c->seqs);
    memset(c, 0, sizeof *c);
}

/* Takes pr's ids into c when they fit the package's limit; the first that
 * would pass the budget fills it (c->full): the set is then a prefix of
 * the requests, so the budget does not favour short prompts. */
static svc_err_t cal_take(eng_calib_t *c, const eng_package_t *pkg, eng_prompt_t *pr,
                          uint64_t max_tokens) {
    if (max_tokens && c->tokens + pr->ids.n > max_tokens)
        c->full = true;
    if (c->full || pr->ids.n == 0 || pr->n_tokens > eng_package_max_length(pkg)) {
        c->skipped++;
        return SVC_OK;
    }
    if (c->n == c->cap) {
        size_t     cap = c->cap ? 2 * c->cap : 64;
        eng_ids_t *v = realloc(c->seqs, cap * sizeof *v);
        if (!v)
            return SVC_ERR_NOMEM;
        c->seqs = v;
        c->cap = cap;
    }
    c->seqs[c->n++] = pr->ids; /* moved: pr gets a fresh list */
    c->tokens += pr->ids.n;
    eng_ids_init(&pr->ids);
    return SVC_OK;
}

/* Every valid question of req's text parts into c. */
static svc_err_t cal_render(const eng_package_t *pkg, const sch_request_t *req, uint64_t max_tokens,
                            eng_calib_t *c, char *errstr, size_t errstr_size) {
    eng_prompt_t pr;
    eng_prompt_init(&pr);
    svc_err_t err = SVC_OK;
    for (size_t p = 0; !err && p < sch_request_n_parts(req); p++) {
        const sch_part_t *part = sch_request_part(req, p);
        for (size_t i = 0; !err && i < part->n_questions; i++) {
            if (part->questions[i].error_code || part->n_images || part->n_videos) {
                c->skipped++;
                continue;
            }
            err = eng_prompt_render(pkg, part, &part->questions[i], &pr, errstr, errstr_size);
            if (!err)
                err = cal_take(c, pkg, &pr, max_tokens);
        }
    }
    eng_prompt_fini(&pr);
    return err;
}

/* body decoded without model checks (SPEC a), then rendered. */
static svc_err_t cal_body(const eng_package_t *pkg, const char *body, size_t len,
                          uint64_t max_tokens, eng_calib_t *c, char *why, size_t why_size) {
    sch_limits_t   limits = {SCH_DEFAULT_MAX_REQUEST_BYTES};
    sch_request_t *req = NULL;
    sch_error_t    e;
    sch_error_init(&e);
    svc_err_t err = sch_request_decode(body, len, &limits, NULL, &req, &e);
    if (err)
        svc_errf(why, why_size, "%s: %s", e.code ? e.code : "invalid_request",
                 e.message ? e.message : "does not decode");
    else
        err = cal_render(pkg, req, max_tokens, c, why, why_size);
    sch_error_fini(&e);
    sch_request_free(req);
    return err;
}

svc_err_t eng_calib_generate(const eng_package_t *pkg, uint64_t seed, size_t n_prompts,
                             uint64_t max_tokens, eng_calib_t *c, char *errstr,
                             size_t errstr_size) {
    svc_buf_t body;
    svc_buf_init(&body, (size_t)1 << 26);
    svc_err_t err = SVC_OK;
    for (size_t i = 0; !err && !c->full && i < n_prompts; i++) {
        char why[512] = "";
        body.len = 0;
        err = eng_calib_request(eng_package_tokenizer(pkg), seed, i, &body);
        if (!err)
            err = cal_body(pkg, body.data, body.len, max_tokens, c, why, sizeof why);
        if (err == SVC_ERR_INVALID) {
            svc_errf(errstr, errstr_size, "calibration request %zu of seed %llu: %s", i,
                     (unsigned long long)seed, why);
            err = SVC_ERR_INTERNAL;
        }
    }
    svc_buf_fini(&body);
    return err;
}

/* The next line of f into line (without its newline); false at the end. */
static bool cal_line(FILE *f, svc_buf_t *line, svc_err_t *err) {
    line->len = 0;
    int ch;
    while ((ch = fgetc(f)) != EOF && ch != '\n')
        if ((*err = svc_buf_addc(line, (char)ch)))
            return false;
    return ch != EOF || line->len > 0;
}

static bool blank(const svc_buf_t *b) {
    for (size_t i = 0; i < b->len; i++)
        if (b->data[i] != ' ' && b->data[i] != '\t' && b->data[i] != '\r')
            return false;
    return true;
}

svc_err_t eng_calib_file(const eng_package_t *pkg, const char *path, uint64_t max_tokens,
                         eng_calib_t *c, char *errstr, size_t errstr_size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        svc_errf(errstr, errstr_size, "open() \"%s\" failed: %s", path, strerror(errno));
        return SVC_ERR_IO;
    }
    svc_buf_t line;
    svc_buf_init(&line, SCH_DEFAULT_MAX_REQUEST_BYTES);
    svc_err_t err = SVC_OK;
    size_t    lineno = 0, before = c->n;
    while (!err && !c->full && cal_line(f, &line, &err)) {
        char why[512] = "";
        lineno++;
        if (blank(&line))
            continue;
        err = cal_body(pkg, line.data, line.len, max_tokens, c, why, sizeof why);
        if (err == SVC_ERR_INVALID)
            svc_errf(errstr, errstr_size, "calibration \"%s\" line %zu: %s", path, lineno, why);
    }
    if (err == SVC_ERR_TOO_LARGE || (!err && ferror(f))) {
        svc_errf(errstr, errstr_size, "calibration \"%s\" line %zu: %s", path, lineno + 1,
                 ferror(f) ? "read error" : "longer than a request may be (8,388,608 bytes)");
        err = ferror(f) ? SVC_ERR_IO : SVC_ERR_INVALID;
    }
    if (!err && c->n == before) {
        svc_errf(errstr, errstr_size,
                 "calibration \"%s\": no question gives a text prompt within the budget", path);
        err = SVC_ERR_INVALID;
    }
    svc_buf_fini(&line);
    fclose(f);
    return err;
}
