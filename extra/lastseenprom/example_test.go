package lastseenprom_test

import (
	"log"
	"net/http"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/extra/lastseenprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// Register a plugin's metrics on the app's own registry and serve them.
func Example() {
	var db *gorm.DB // the app's handle
	p := lastseen.New(lastseen.Config{Redis: redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})})
	if err := db.Use(p); err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := lastseenprom.New(reg, p, lastseenprom.WithConstLabels(prometheus.Labels{"service": "api"})); err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
}
