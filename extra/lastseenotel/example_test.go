package lastseenotel_test

import (
	"log"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/extra/lastseenotel"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"gorm.io/gorm"
)

// Report a plugin's metrics and spans to the app's providers.
func Example() {
	var db *gorm.DB // the app's handle
	p := lastseen.New(lastseen.Config{Redis: redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})})
	if err := db.Use(p); err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider( /* sdkmetric.WithReader(an exporter's reader) */ )
	tp := sdktrace.NewTracerProvider( /* sdktrace.WithBatcher(an exporter) */ )
	inst, err := lastseenotel.New(p, lastseenotel.WithMeterProvider(mp), lastseenotel.WithTracerProvider(tp))
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Close()
}
