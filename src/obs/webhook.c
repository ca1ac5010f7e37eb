/* Alert webhooks: one HTTP POST per fired rule, through libcurl (proxies,
 * TLS and redirects are its business, not ours). */
#include "obs/webhook.h"

#include <curl/curl.h>
#include <pthread.h>
#include "core/core.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void init_curl(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* The receiver's reply is not needed: drop it instead of printing it. */
static size_t discard(char *p, size_t size, size_t n, void *user) {
    (void)p, (void)user;
    return size * n;
}

ts_status ts_webhook_post(const char *url, const char *json, double timeout_s) {
    if (!url || !*url || !json) return ts_fail(TS_ERR_INVALID, "webhook: no URL or body");
    pthread_once(&curl_once, init_curl);
    if (curl_init_rc != CURLE_OK)
        return ts_fail(TS_ERR_IO, "webhook: libcurl: %s", curl_easy_strerror(curl_init_rc));
    CURL *h = curl_easy_init();
    if (!h) return ts_fail(TS_ERR_NOMEM, "webhook: libcurl handle");
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_USERAGENT, "tessel-alert");
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK)
        return ts_fail(TS_ERR_IO, "webhook %s: %s", url, err[0] ? err : curl_easy_strerror(rc));
    if (code >= 400) return ts_fail(TS_ERR_IO, "webhook %s: HTTP status %ld", url, code);
    return TS_OK;
}
