/* html_assets.h - internal to reports/: the HTML page's assets
 * (reports/html/report.css, body.html, report.js) as bytes, generated into
 * html_assets.c by reports/html/embed.sh. */
#ifndef REPORT_HTML_ASSETS_H
#define REPORT_HTML_ASSETS_H

#define HTML_ASSET __attribute__((visibility("hidden")))

HTML_ASSET extern const unsigned char report_html_css[];
HTML_ASSET extern const unsigned int  report_html_css_len;
HTML_ASSET extern const unsigned char report_html_body[];
HTML_ASSET extern const unsigned int  report_html_body_len;
HTML_ASSET extern const unsigned char report_html_js[];
HTML_ASSET extern const unsigned int  report_html_js_len;

#endif
